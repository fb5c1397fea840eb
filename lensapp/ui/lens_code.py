"""'Show the code' under a lens tab: the view as a short nnsight script, in the form the visitor picks.

The panel (its form, `TransformersModel` that runs anywhere or the app's own `VLLM`, and the code box) and
what its events call: the script written from the result in hand (`snippets/lens.py`), the model named as
a visitor can load it and the lens by its file's name. It knows a tab only by its name and the lens it
reads; nothing here runs a model.
"""

from __future__ import annotations

import gradio as gr

from ..snippets import model_reference
from ..snippets.lens import lens_snippet
from .tabs import Components


def build_code_panel(name: str) -> Components:
    """The "Show the code" accordion of the tab `name`: its form and its code box, by name."""
    with gr.Accordion("Show the code", open=False, elem_id=f"{name}-code-box"):
        gr.Markdown("This view as a short nnsight script: paste it into a notebook (the copy button is at "
                    "the top right) to get the same numbers.")
        code_form = gr.Radio([("TransformersModel (runs anywhere)", "transformers"),
                              ("vLLM (the app's engine)", "vllm")], value="transformers", show_label=False)
        code = gr.Code(language="python", interactive=False, elem_id=f"{name}-code")
    return {"code_form": code_form, "code": code}


def show_code(lens: str, service, guard, values: dict, request: gr.Request = None) -> dict:
    result = values["state"]
    if result is None:
        return {}
    return guard.ui(request, lambda: {"code": code_for(service, result, lens, values["code_form"],
                                                       bool(values["chat"]))})


def code_for(service, result, lens: str, form: str, chat: bool = False) -> str:
    """The view of `result` as a runnable nnsight script (snippets/lens.py)."""
    model, note = model_reference(service.cfg.engine.model, service.info.name)
    return lens_snippet(family=service.model.family, model=model, prompt=result.prompt,
                        layers=result.layers, k=result.lenses[next(iter(result.lenses))].top_ids.shape[-1], lens=lens,
                        jlens=service.jlens.describe()["source"] if service.jlens is not None else None,
                        chat=chat, form="vllm" if form == "vllm" else "transformers", model_note=note,
                        bos=service.prompts.bos)

"""The Components tab: who wrote the answer. Each attention layer's, head's and MLP's direct effect on one logit,
and where a layer's heads look from there.

Its inputs are the `components` request's fields (`views.TAB_VIEWS`), made by its form; its outputs a dict of
named components; the handlers below are what its events call (module-level, from the inputs' values by name
to the outputs' updates by name, through the guard). A lens cell links here (`cell_link`): "who wrote this?"
opens the components of that cell's top-1 token at its position, with its layer's attention pattern.
"""

from __future__ import annotations

from functools import partial

import gradio as gr
import numpy as np

from ..charts import DisplaySettings, show_token
from ..charts import components as chart
from ..engine.run.anatomy import anatomy_of
from ..service.components import model_shape, unavailable
from ..service.kinds import KINDS
from ..snippets import model_reference
from ..snippets.components import components_snippet
from .downloads import Downloads
from .first_view import FIRST_CHART, PHONE_LATER
from .form import Form, asked
from .kept import Kept, kept_state, recipe
from .permalinks import query_string
from .tabs import Components, TabParts, build_chart, how_to, md_text, on
from .views import TAB_VIEWS, TabView, View

HOW_TO = """
A transformer's last residual stream is a sum: the token's embedding, plus what every attention layer and
every MLP wrote into it. Read through the final norm, with the norm's scale **frozen** at the actual final
residual, the logit of the target splits exactly into one number per part: its **direct effect**. The parts
sum to the logit (the summary shows both).

- **By layer**: each layer's attention (blue) and MLP (orange) side by side; the line is the running total,
  which ends at the logit. With a **foil**, the logit is target minus foil: what pushes one word over the other.
- **By head**: each attention layer split into its heads (orange: writes toward the target, blue: away).
  Hover a head for its value and the positions it attends to most from this position.
- **Attention pattern** (choose a layer): where that layer's heads look from this position, and each head's
  whole pattern (queries x keys) as small multiples.

What a direct effect is *not*: what would happen without the part. A head's output is also read by every
later layer (its indirect effect), and removing it would change the norm's scale too. To test what causes the
answer, use the Intervene tab. On vLLM the attention weights are recomputed from the queries and keys the
attention kernel receives: vLLM itself never forms them.
"""


def build_components_tab(service, guard, downloads: Downloads,
                         view: TabView = TAB_VIEWS["components"]) -> TabParts:
    with gr.Tab("Components", id=view.name):
        gr.Markdown("Who wrote the answer: each layer's attention, each head and each MLP's direct effect on one "
                    "logit, and where the heads look.", elem_id=f"{view.name}-intro")
        why = unavailable(service)
        if why:
            gr.Markdown(f"**Not available for this model:** {md_text(why)}.", elem_id=f"{view.name}-missing")
            return TabParts(view, {})
        how_to(HOW_TO)
        form = Form(view, service)
        _inputs(form, service)
        run_button = gr.Button("Who wrote it?", variant="primary", elem_id=f"{view.name}-run", elem_classes=["run"])
        outputs = _outputs(view, downloads)
    parts = {**form.inputs, **outputs}
    run_fn = partial(run, view, service, guard)
    on([run_button.click, form.inputs["prompt"].submit], run_fn, parts, form.inputs, outputs)
    on(outputs["state"].change, partial(show_code, service, guard), parts, ["state", "chat"], ["code"])
    return TabParts(view, form.inputs, {k: v for k, v in outputs.items() if k != "code"}, run_fn,
                    run_button=run_button)


def _inputs(form: Form, service) -> None:
    with gr.Row():
        form.add("prompt", lines=2, max_lines=8, scale=3)
        form.add("target")
        form.add("foil")
    with gr.Row(elem_classes=[PHONE_LATER]):             # on a phone, after the picture (first_view.py)
        form.add("position")
        form.add("patterns", label=f"Attention pattern of layer (0..{service.info.n_layers - 1}, -1: the last; "
                                   "empty: none)")
        form.add("chat")
        form.rest()


def _outputs(view: TabView, downloads: Downloads) -> Components:
    """What a readout writes, by name (and the code under it)."""
    name = view.name
    out = {"summary": gr.Markdown(elem_id=f"{name}-summary")}
    for key in ("by_layer", "by_head", "pattern_row", "pattern_grid"):
        out[key] = gr.Plot(elem_id=f"{name}-{key.replace('_', '-')}", show_label=False,
                           elem_classes=["lens-plot", *([FIRST_CHART] if key == "by_layer" else [])],
                           visible=not key.startswith("pattern"))
    out["state"] = kept_state()
    out.update(downloads.buttons(name, out["state"]))
    with gr.Accordion("Show the code", open=False, elem_id=f"{name}-code-box"):
        gr.Markdown("This view as a short nnsight script (transformers, eager attention): paste it into a "
                    "notebook to get the same numbers.")
        out["code"] = gr.Code(language="python", interactive=False, elem_id=f"{name}-code")
    return out


# -- what its events call -------------------------------------------------------------------------------

def run(view: TabView, service, guard, values: dict, request: gr.Request = None) -> dict:
    """The readout of the inputs' `values` (by name), through the guard."""
    return guard.ui(request, read_components, service, values, view)


def read_components(service, values: dict, view: TabView = TAB_VIEWS["components"]) -> dict:
    """The inputs' values by name -> the outputs' updates by name."""
    req = asked(view, service, {name: _blank(value) for name, value in values.items()})
    result = KINDS[view.kind].run(service, req)
    s = DisplaySettings()
    pattern = result.pattern is not None
    return {
        "state": Kept(result, recipe(view.kind, req)), "summary": summary(result),
        "by_layer": picture(req, values, result), "by_head": build_chart(chart.head_heatmap, result, s),
        "pattern_row": gr.Plot(value=build_chart(chart.pattern_row, result, s) if pattern else None, visible=pattern),
        "pattern_grid": gr.Plot(value=build_chart(chart.pattern_grid, result, s) if pattern else None,
                                visible=pattern),
        **Downloads.shown(),
    }


def show_code(service, guard, values: dict, request: gr.Request = None) -> dict:
    result, chat = values["state"], bool(values["chat"])       # the chat option the readout was run with
    return {} if result is None else guard.ui(request, lambda: {"code": code_for(service, result, chat)})


def picture(req, values: dict, result):
    """The tab's first chart (each layer's part in the answer): `read_components`'s, and a link's first view's
    (`first_view.py`)."""
    return build_chart(chart.layer_bars, result, DisplaySettings())


def _blank(value):
    """A form's empty number box (None, or NaN from some browsers) means "not given"."""
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value


def summary(result) -> str:
    """The logit, the parts' sum, and the heads and layers that wrote most, in Markdown."""
    where = f"after {md_text(show_token(result.input_tokens[result.position]))} (position {result.position})"
    layer, head = np.unravel_index(np.abs(result.heads).argmax(), result.heads.shape)
    top = result.top_positions[layer, head, 0]
    strongest = int(np.abs(result.attn + result.mlp).argmax())
    part = "attention" if abs(result.attn[strongest]) >= abs(result.mlp[strongest]) else "MLP"
    lines = [f"**{md_text(result.what)}** {where} = **{result.logit:.4f}**; the parts sum to {result.total:.4f} "
             f"(gap {result.gap:.1e}): embedding {result.embed:.3f}, norm bias {result.bias:.3f}.",
             f"- The largest layer: **{strongest}**, mostly its {part} ({float(result.attn[strongest]):+.3f} "
             f"attention, {float(result.mlp[strongest]):+.3f} MLP).",
             f"- The strongest head: **layer {layer}, head {head}** ({float(result.heads[layer, head]):+.3f}), "
             f"looking most at {md_text(show_token(result.input_tokens[top]))} (position {top}, weight "
             f"{float(result.top_weights[layer, head, 0]):.2f})."]
    if result.pattern is None:
        lines.append(f"- Choose a layer for its attention pattern (layer {layer} holds the strongest head).")
    return "\n".join(lines)


def code_for(service, result, chat: bool = False) -> str:
    """The view as a runnable nnsight script (snippets/components.py), its prompt in the chat template when `chat`."""
    model, note = model_reference(service.cfg.engine.model, service.info.name)
    return components_snippet(family=service.model.family, anatomy=anatomy_of(service.model.hf_config.model_type),
                              model=model, prompt=result.prompt, target=result.target.text,
                              foil=None if result.foil is None else result.foil.text, position=result.position,
                              patterns=result.patterns_layer, head_dim=model_shape(service.model.hf_config)[1],
                              model_note=note, bos=service.prompts.bos, chat=chat)


def cell_link(prompt: str, chat: bool = False):
    """For a lens heatmap's cells: (layer, position, token) -> the link that opens this tab on that cell: who
    wrote its top-1 token at its position, with its layer's attention pattern ("who wrote this?")."""
    def link(layer: int, position: int, token: str) -> str:
        word = token.strip() or token
        view = View(tab="components", prompt=prompt, target=word, foil="", position=position, patterns=layer,
                    chat=chat)
        return "?" + query_string(view)
    return link


__all__ = ["build_components_tab", "cell_link", "read_components"]

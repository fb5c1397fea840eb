"""The Components tab: who wrote the answer. Each attention layer's, head's and MLP's direct effect on one logit,
and where a layer's heads look from there.

Laid out by name: the inputs are the request's fields (`INPUTS`, in `ComponentsRequest`'s order), the outputs a
dict of named components (`OUTPUTS`); `read_components(service, values)` is the handler, a module-level
function from the inputs' values by name to the outputs' by name (tested directly, without a page), run
through the guard. A lens cell links here (`cell_link`): "who wrote this?" opens the components of that cell's
top-1 token at its position, with its layer's attention pattern.
"""

from __future__ import annotations

import gradio as gr
import numpy as np

from ..charts import DisplaySettings, show_token
from ..charts import components as chart
from ..engine.anatomy import anatomy_of
from ..service import ComponentsRequest
from ..service.components import model_shape, unavailable
from ..service.field import fields_of
from ..snippets import components_snippet, model_reference
from .downloads import Downloads
from .permalinks import View, query_string, view_of
from .tabs import PRIVATE, TabParts, build_chart, md_text

INPUTS = tuple(fields_of(ComponentsRequest))          # prompt, target, foil, position, patterns, chat
OUTPUTS = ("state", "summary", "by_layer", "by_head", "pattern_row", "pattern_grid", "csv", "json")

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


def build_components_tab(service, guard, downloads: Downloads) -> TabParts:
    d = View(tab="components")
    info = service.info
    with gr.Tab("Components", id="components"):
        gr.Markdown("Who wrote the answer: each layer's attention, each head and each MLP's direct effect on one "
                    "logit, and where the heads look.", elem_id="components-intro")
        why = unavailable(service)
        if why:
            gr.Markdown(f"**Not available for this model:** {md_text(why)}.", elem_id="components-missing")
            return TabParts("components", {}, lambda: View(tab="components"))
        with gr.Accordion("How to read this", open=False):
            gr.Markdown(HOW_TO)
        with gr.Row():
            prompt = gr.Textbox(label="Prompt", value=d.prompt, lines=2, max_lines=8, scale=3,
                                elem_id="components-prompt")
            target = gr.Textbox(label="Target word (its first token)", value=d.target, elem_id="components-target")
            foil = gr.Textbox(label="Foil word (optional: target minus foil)", value=d.foil,
                              elem_id="components-foil")
        with gr.Row():
            position = gr.Number(label="Position (-1: the last)", value=d.position, precision=0,
                                 elem_id="components-position")
            patterns = gr.Number(label=f"Attention pattern of layer (0..{info.n_layers - 1}, -1: the last; empty: "
                                       "none)", value=d.patterns, precision=0, elem_id="components-patterns")
            chat = gr.Checkbox(label="Wrap in the chat template (instruct models)", value=d.chat)
        run_button = gr.Button("Who wrote it?", variant="primary", elem_id="components-run", elem_classes=["run"])
        summary = gr.Markdown(elem_id="components-summary")
        by_layer = gr.Plot(elem_id="components-by-layer", elem_classes=["lens-plot"], show_label=False)
        by_head = gr.Plot(elem_id="components-by-head", elem_classes=["lens-plot"], show_label=False)
        pattern_row = gr.Plot(elem_id="components-pattern-row", elem_classes=["lens-plot"], show_label=False,
                              visible=False)
        pattern_grid = gr.Plot(elem_id="components-pattern-grid", elem_classes=["lens-plot"], show_label=False,
                               visible=False)
        state = gr.State()
        csv_file, json_file = downloads.buttons("components", state)
        with gr.Accordion("Show the code", open=False, elem_id="components-code-box"):
            gr.Markdown("This view as a short nnsight script (transformers, eager attention): paste it into a "
                        "notebook to get the same numbers.")
            code = gr.Code(language="python", interactive=False, elem_id="components-code")

    inputs = {"prompt": prompt, "target": target, "foil": foil, "position": position, "patterns": patterns,
              "chat": chat}
    outputs = {"state": state, "summary": summary, "by_layer": by_layer, "by_head": by_head,
               "pattern_row": pattern_row, "pattern_grid": pattern_grid, "csv": csv_file, "json": json_file}
    assert tuple(inputs) == INPUTS and tuple(outputs) == OUTPUTS

    def run(*values, request: gr.Request = None):
        out = guard.ui(request, read_components, service, dict(zip(INPUTS, values)))
        return tuple(out[name] for name in OUTPUTS)

    run_button.click(run, list(inputs.values()), list(outputs.values()), **PRIVATE)
    prompt.submit(run, list(inputs.values()), list(outputs.values()), **PRIVATE)
    state.change(lambda result: gr.skip() if result is None else code_for(service, result), state, code, **PRIVATE)
    return TabParts("components", inputs, lambda *values: view_of("components", **dict(zip(INPUTS, values))), run,
                    list(inputs.values()), list(outputs.values()), run_button, from_view=values_of)


def values_of(view: View) -> list:
    """The tab's input values for a view (a number box shows an empty patterns layer as nothing)."""
    return [getattr(view, name) for name in INPUTS]


def read_components(service, values: dict) -> dict:
    """The handler: the tab's input values by name -> its outputs by name."""
    req = ComponentsRequest.parse(**{name: _blank(values.get(name)) for name in INPUTS})
    result = service.components(req)
    s = DisplaySettings()
    pattern = result.pattern is not None
    return {
        "state": result, "summary": summary(result),
        "by_layer": build_chart(chart.layer_bars, result, s), "by_head": build_chart(chart.head_heatmap, result, s),
        "pattern_row": gr.Plot(value=build_chart(chart.pattern_row, result, s) if pattern else None, visible=pattern),
        "pattern_grid": gr.Plot(value=build_chart(chart.pattern_grid, result, s) if pattern else None,
                                visible=pattern),
        "csv": gr.Button(visible=True), "json": gr.Button(visible=True),
    }


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


def code_for(service, result) -> str:
    """The view as a runnable nnsight script (snippets.py)."""
    model, note = model_reference(service.cfg.model, service.info.name)
    return components_snippet(family=service.model.family, anatomy=anatomy_of(service.model.hf_config.model_type),
                              model=model, prompt=result.prompt, target=result.target.text,
                              foil=None if result.foil is None else result.foil.text, position=result.position,
                              patterns=result.patterns_layer, head_dim=model_shape(service.model.hf_config)[1],
                              model_note=note)


def cell_link(prompt: str, chat: bool = False):
    """For a lens heatmap's cells: (layer, position, token) -> the link that opens this tab on that cell: who
    wrote its top-1 token at its position, with its layer's attention pattern ("who wrote this?")."""
    def link(layer: int, position: int, token: str) -> str:
        word = token.strip() or token
        view = View(tab="components", prompt=prompt, target=word, foil="", position=position, patterns=layer,
                    chat=chat)
        return "?" + query_string(view)
    return link


__all__ = ["INPUTS", "OUTPUTS", "build_components_tab", "cell_link", "read_components"]

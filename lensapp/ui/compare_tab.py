"""The compare tab: 2-4 prompts read the same way, side by side, and where their predictions part ways."""

from __future__ import annotations

import gradio as gr

from .. import charts
from ..config import MAX_COMPARE_PROMPTS, MAX_K
from ..service import LensRequest
from .downloads import Downloads
from .examples import compare_examples
from .lens_tab import colour_metric, grid_tables, punctuation_box
from .permalinks import View, as_text, view_of
from .tabs import PRIVATE, TabParts, build_chart, lens_choices, md_text

HOW_TO = """
What people do with a lens is contrast: "The capital of France is" against "… of Italy is", a sentence
against its translation, a fact against a counterfactual. The prompts run together and are read the same
way (lens, layers, k, targets).

- One heatmap per prompt, on **one colour scale**. Prompts of different lengths are aligned at their
  **last token**, where the next token is predicted; the empty columns before a shorter prompt are
  padding, not data.
- The table reads every prompt's last position, layer by layer, and marks where their top-1 agree.
  *They part ways* at the lowest layer from which they disagree all the way up.
"""


def build_compare_tab(service, guard, downloads: Downloads) -> TabParts:
    d = View(tab="compare")
    choices = lens_choices(service)
    with gr.Tab("Compare", id="compare"):
        gr.Markdown("Two to four prompts side by side: where do their predictions part ways?")
        with gr.Accordion("How to read this", open=False):
            gr.Markdown(HOW_TO)
        boxes = []
        with gr.Row():
            for i in range(MAX_COMPARE_PROMPTS):
                value = d.prompts[i] if i < len(d.prompts) else ""
                boxes.append(gr.Textbox(label=f"Prompt {i + 1}" + (" (optional)" if i >= 2 else ""), value=value,
                                        lines=2, max_lines=6, elem_id=f"compare-prompt{i + 1}"))
        with gr.Row():
            lens = gr.Radio(choices, value=d.lens, label="Lens", elem_id="compare-lens")
            layers = gr.Textbox(label="Layers (all, 10-20 or 0,5,-1)", value=d.layers, elem_id="compare-layers")
            k = gr.Number(label="Top-k", value=d.k, minimum=1, maximum=MAX_K, precision=0, elem_id="compare-k")
            targets = gr.Textbox(label="Target word(s), comma-separated (optional)", value=as_text(d.targets),
                                 elem_id="compare-targets")
        with gr.Row():
            metric = gr.Dropdown(label="Colour cells by", value=d.metric, elem_id="compare-metric",
                                 choices=[(m.title, key) for key, m in charts.METRICS.items()])
            chat = gr.Checkbox(label="Wrap in the chat template (instruct models)", value=d.chat)
            raw = gr.Checkbox(label="Raw logits", value=d.raw, elem_id="compare-raw",
                              info="h·W_U alone, without the model's own logit soft-capping or scaling")
            punct = punctuation_box(d.punct, "compare-punct")
        run_button = gr.Button("Compare", variant="primary", elem_id="compare-run", elem_classes=["run"])
        examples = compare_examples(boxes[0], boxes[1], targets)
        summary = gr.Markdown(elem_id="compare-summary")
        heatmaps = gr.Plot(elem_id="compare-heatmaps", elem_classes=["lens-plot"], show_label=False)
        with gr.Accordion("Heatmaps as tables", open=False, elem_id="compare-grid-box"):
            grid_table = gr.HTML(elem_id="compare-grid-table", elem_classes=["grid-table"])
        curves = gr.Plot(visible=False, elem_id="compare-targets-plot", elem_classes=["lens-plot"], show_label=False)
        table = gr.Dataframe(label="Each prompt's top-1 at its last position, every layer", interactive=False,
                             wrap=True, elem_id="compare-table")
        state = gr.State()
        csv_file, json_file = downloads.buttons("compare", state)

    def readout(*values):
        lens, layers, k, targets, metric, chat, raw, punct = (*values[MAX_COMPARE_PROMPTS:], False)[:8]
        if not isinstance(lens, str) or lens not in {value for _, value in choices}:
            lens = "logit"
        req = LensRequest.parse(prompts=filled(values[:MAX_COMPARE_PROMPTS]), lens=lens, layers=layers, k=k,
                                targets=targets, chat=chat, raw=raw, skip_punctuation=punct)
        metric, words = colour_metric(metric, req.targets), req.targets
        comparison = service.compare(req)
        shown = ("jacobian", "logit") if lens == "both" else (lens,)
        return (
            part_ways_summary(comparison, shown),
            build_chart(charts.compare_heatmaps, comparison, shown, metric),
            gr.Plot(value=build_chart(charts.compare_targets, comparison, shown) if words else None,
                    visible=bool(words)),
            # "#n" columns: display_tokens makes their whitespace visible
            charts.display_tokens(comparison.last_position_table(shown[0]).rename(
                columns=lambda c: c.replace("prompt ", "#") if c.startswith("prompt ") else c)),
            gr.Button(visible=True),                 # the downloads: built from `comparison` when asked for
            gr.Button(visible=True),
            "".join(f"<h4>Prompt {n}</h4>" + grid_tables(r, shown) for n, r in enumerate(comparison.results, 1)),
            comparison,
        )

    def run(*values, request: gr.Request = None):
        return guard.ui(request, readout, *values)

    inputs = [*boxes, lens, layers, k, targets, metric, chat, raw, punct]
    outputs = [summary, heatmaps, curves, table, csv_file, json_file, grid_table, state]
    run_button.click(run, inputs, outputs, **PRIVATE)
    examples.load_input_event.then(run, inputs, outputs, **PRIVATE)

    def to_view(*values) -> View:
        names = ("lens", "layers", "k", "targets", "metric", "chat", "raw", "punct")
        return view_of("compare", prompts=filled(values[:MAX_COMPARE_PROMPTS]),
                       **dict(zip(names, values[MAX_COMPARE_PROMPTS:])))

    def from_view(view: View) -> list:
        prompts = list(view.prompts)[:MAX_COMPARE_PROMPTS]
        prompts += [""] * (MAX_COMPARE_PROMPTS - len(prompts))
        return [*prompts, view.lens, view.layers, view.k, as_text(view.targets), view.metric, view.chat, view.raw,
                view.punct]

    fields = {**{f"prompt{i + 1}": box for i, box in enumerate(boxes)}, "lens": lens, "layers": layers, "k": k,
              "targets": targets, "metric": metric, "chat": chat, "raw": raw, "punct": punct}
    return TabParts("compare", fields, to_view, run, inputs, outputs, run_button, from_view=from_view)


def filled(boxes) -> list:
    """The prompt boxes that hold text (the optional ones may be left empty)."""
    return [p for p in boxes if not (p is None or isinstance(p, str) and not p.strip())]


def part_ways_summary(comparison, lenses: tuple[str, ...]) -> str:
    lines = []
    for lens in lenses:
        split = comparison.part_ways(lens)
        last = [charts.show_token(r.lenses[lens].top_tokens[-1][-1][0]) for r in comparison.results]
        said = " · ".join(f"prompt {n}: {md_text(t)}" for n, t in enumerate(last, 1))
        where = ("they agree at the top" if split is None else f"they part ways at layer {split}"
                 if split > comparison.layers[0] else "they differ from the first layer on")
        lines.append(f"**{charts.LENS_TITLES[lens]}**: {where}. At the last layer: {said}.")
    return "\n\n".join(lines)

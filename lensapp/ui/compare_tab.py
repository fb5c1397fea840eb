"""The compare tab: 2-4 prompts read the same way, side by side, and where their predictions part ways.

Its inputs are the `compare` request's fields (`views.TAB_VIEWS`), the prompts as prompt1..prompt4."""

from __future__ import annotations

from functools import partial

import gradio as gr

from .. import charts, lens_kinds
from .downloads import Downloads
from .examples import compare_examples
from .first_view import FIRST_CHART, PHONE_LATER
from .form import Form, add_reading, asked
from .kept import Kept, kept_state, recipe
from .readout import colour_metric, grid_tables
from .tabs import Components, TabParts, build_chart, how_to, md_text, on
from .views import TAB_VIEWS, TabView

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


def build_compare_tab(service, guard, downloads: Downloads, view: TabView = TAB_VIEWS["compare"]) -> TabParts:
    with gr.Tab("Compare", id=view.name):
        gr.Markdown("Two to four prompts side by side: where do their predictions part ways?")
        how_to(HOW_TO)
        form = Form(view, service)
        with gr.Row():
            boxes = form.add("prompts", lines=2, max_lines=6,
                             label=lambda i: f"Prompt {i}" + (" (optional)" if i > 2 else ""))
        with gr.Row(elem_classes=[PHONE_LATER]):         # on a phone, after the picture (first_view.py)
            add_reading(form, layers="Layers (all, 10-20 or 0,5,-1)")
        with gr.Row(elem_classes=[PHONE_LATER]):
            form.add("metric")
            form.add("chat")
            form.add("raw")
            form.add("punct")
        form.rest()
        run_button = gr.Button("Compare", variant="primary", elem_id=f"{view.name}-run", elem_classes=["run"])
        with gr.Column(elem_classes=[PHONE_LATER]):
            examples = compare_examples(boxes[0], boxes[1], form.inputs["targets"])
        outputs = _outputs(view, downloads)
    run_fn = partial(run, view, service, guard)
    for trigger in (run_button.click, examples.load_input_event.then):
        on(trigger, run_fn, {**form.inputs, **outputs}, form.inputs, outputs)
    return TabParts(view, form.inputs, outputs, run_fn, run_button=run_button)


def _outputs(view: TabView, downloads: Downloads) -> Components:
    """What a comparison writes, by name."""
    out = {"summary": gr.Markdown(elem_id=f"{view.name}-summary"),
           "heatmaps": gr.Plot(elem_id=f"{view.name}-heatmaps", elem_classes=["lens-plot", FIRST_CHART],
                               show_label=False)}
    with gr.Accordion("Heatmaps as tables", open=False, elem_id=f"{view.name}-grid-box"):
        out["grid_table"] = gr.HTML(elem_id=f"{view.name}-grid-table", elem_classes=["grid-table"])
    out["curves"] = gr.Plot(visible=False, elem_id=f"{view.name}-targets-plot", elem_classes=["lens-plot"],
                            show_label=False)
    out["table"] = gr.Dataframe(label="Each prompt's top-1 at its last position, every layer", interactive=False,
                                wrap=True, elem_id=f"{view.name}-table")
    out["state"] = kept_state()
    out.update(downloads.buttons(view.name, out["state"]))
    return out


def run(view: TabView, service, guard, values: dict, request: gr.Request = None) -> dict:
    """The comparison of the inputs' `values` (by name), through the guard."""
    return guard.ui(request, readout, view, service, values)


def picture(req, values: dict, comparison):
    """The tab's first chart for `values` and the request they ask: `readout`'s, and a link's first view's
    (`first_view.py`)."""
    metric = colour_metric(values.get("metric"), req.targets, quiet=True)
    return build_chart(charts.compare_heatmaps, comparison, lens_kinds.shown(req.lens), metric)


def readout(view: TabView, service, values: dict) -> dict:
    req = asked(view, service, values)
    colour_metric(values.get("metric"), req.targets)            # said once, if the colour cannot be drawn
    words = req.targets
    comparison = service.compare(req)
    shown = lens_kinds.shown(req.lens)
    return {
        "summary": part_ways_summary(comparison, shown),
        "heatmaps": picture(req, values, comparison),
        "curves": gr.Plot(value=build_chart(charts.compare_targets, comparison, shown) if words else None,
                          visible=bool(words)),
        # "#n" columns: display_tokens makes their whitespace visible
        "table": charts.display_tokens(comparison.last_position_table(shown[0]).rename(
            columns=lambda c: c.replace("prompt ", "#") if c.startswith("prompt ") else c)),
        **Downloads.shown(),
        "grid_table": "".join(f"<h4>Prompt {n}</h4>" + grid_tables(r, shown)
                              for n, r in enumerate(comparison.results, 1)),
        "state": Kept(comparison, recipe(view.kind, req)),
    }


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

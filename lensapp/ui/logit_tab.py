"""The logit lens tab: a layer x token heatmap, the top-k table at one position, target curves."""

from __future__ import annotations

import json

import gradio as gr

from .. import charts
from ..engine import LensRequest
from .examples import lens_examples
from .permalinks import View
from .tab import (PRIVATE, Exports, TabParts, call_engine, int_or, lens_inputs, lens_summary, position_choices,
                  split_targets, to_int, warn)

HOW_TO = """
Each **row** is a layer (layer 0 at the bottom, the last layer at the top) and each **column** a prompt
token. A cell shows the token the model would predict *next* if it stopped at that layer: the layer's
residual stream sent through the model's own final norm and unembedding. The colour is the metric you
choose; hover a cell for its top-k.

- Read a column bottom to top to watch a prediction form. The top row is the model's real output.
- `␣` is a space, `↵` a newline, `⇥` a tab: tokens often start with a space.
- Early layers of most models read out noise or the current token itself; that is expected.
- *KL to final* is how far a layer's guess is from the model's final distribution (0 = the same).
- *Target* metrics score the first token of each target word as it would follow the prompt (a leading
  space is added).
"""


def build_logit_tab(engine, cfg, exports: Exports) -> TabParts:
    d = View()
    n = engine.info.n_layers
    with gr.Tab("Logit lens", id="logit"):
        gr.Markdown("What each layer would predict next, read through the model's own unembedding.")
        with gr.Accordion("How to read this", open=False):
            gr.Markdown(HOW_TO)
        prompt, targets, layers, k, metric, chat = lens_inputs(
            "logit", d, f"Layers (all, 10-20 or 0,5,-1; this model: 0..{n - 1})")
        run_button = gr.Button("Run logit lens", variant="primary", elem_id="logit-run")
        examples = lens_examples(prompt, targets)
        summary = gr.Markdown(elem_id="logit-summary")
        heatmap = gr.Plot(label="Logit lens: layers × prompt tokens", elem_id="logit-heatmap",
                          elem_classes=["lens-plot"], show_label=False)
        position = gr.Dropdown(label="Token table: position", choices=[], interactive=True, elem_id="logit-position")
        table = gr.Dataframe(label="Top-k at this position, every layer (p = probability)", interactive=False,
                             wrap=True, elem_id="logit-table")
        curves = gr.Plot(label="Targets across layers", visible=False, elem_classes=["lens-plot"], show_label=False)
        with gr.Row():
            csv_file = gr.DownloadButton("Download CSV", visible=False, size="sm")
            json_file = gr.DownloadButton("Download JSON", visible=False, size="sm")
        state = gr.State()

    def run(prompt, layers, k, targets, metric, chat):
        words = split_targets(targets)
        if charts.METRICS.get(metric, charts.METRICS["top1_prob"]).needs_target and not words:
            warn("That colour needs a target word; showing top-1 probability instead.")
            metric = "top1_prob"
        req = LensRequest(prompts=(prompt,), lens="logit", layers=(layers or "all").strip(), k=to_int(k, "k"),
                          targets=words, chat=bool(chat))
        result = call_engine(engine.lens, req)[0]
        last = len(result.input_ids) - 1
        return (
            result,
            charts.lens_heatmap(result, "logit", metric if metric in charts.METRICS else "top1_prob"),
            lens_summary(result, ("logit",)),
            gr.Dropdown(choices=position_choices(result.input_tokens), value=last),
            charts.display_tokens(result.top_k_table("logit", last)),
            gr.Plot(value=charts.target_curves(result, ("logit",)) if words else None, visible=bool(words)),
            gr.DownloadButton(value=exports.write("logit-lens", ".csv", result.to_csv()), visible=True),
            gr.DownloadButton(value=exports.write("logit-lens", ".json",
                                                  json.dumps(result.to_json(), ensure_ascii=False)), visible=True),
        )

    outputs = [state, heatmap, summary, position, table, curves, csv_file, json_file]
    inputs = [prompt, layers, k, targets, metric, chat]
    run_button.click(run, inputs, outputs, **PRIVATE)
    prompt.submit(run, inputs, outputs, **PRIVATE)
    examples.load_input_event.then(run, inputs, outputs, **PRIVATE)
    def show_position(result, pos):
        if result is None or pos is None:
            return gr.skip()
        return charts.display_tokens(result.top_k_table("logit", int(pos)))

    position.input(show_position, [state, position], table, **PRIVATE)

    def to_view(prompt, layers, k, targets, metric, chat) -> View:
        return View(tab="logit", prompt=prompt or "", layers=layers or "all", k=int_or(k, d.k), targets=targets or "",
                    metric=metric or d.metric, chat=bool(chat))

    fields = {"prompt": prompt, "layers": layers, "k": k, "targets": targets, "metric": metric, "chat": chat}
    return TabParts("logit", fields, to_view, run, inputs, outputs, run_button, examples)

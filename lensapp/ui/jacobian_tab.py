"""The Jacobian lens tab: J-lens and logit lens side by side over the same cells, and where they differ."""

from __future__ import annotations

import html
import json

import gradio as gr
import pandas as pd

from .. import charts
from ..engine import LensRequest
from ..engine.requests import parse_layers
from .examples import lens_examples
from .permalinks import View
from .tab import (PRIVATE, Exports, TabParts, call_engine, int_or, lens_inputs, lens_source, lens_summary,
                  md_text, position_choices, split_targets, to_int, warn)

HOW_TO = """
The **logit lens** reads layer *l* as if the layers after it did nothing. The **Jacobian lens** first moves
the residual into the last layer's basis with a pre-fitted average Jacobian J_l = E[∂h_final / ∂h_l],
then unembeds: what the model is *disposed* to say from layer *l*, not what it would say if it stopped there.

- Both heatmaps share rows (layers that have a J), columns (prompt tokens) and the colour scale.
- The **difference** view marks cells whose top-1 differs. Orange: the J-lens is closer to the model's
  final distribution there (lower KL); blue: the logit lens is. Grey: both lenses agree.
- **Early layers read out degenerate tokens under the J-lens** (runs of `____`, punctuation, the same
  token everywhere): an average Jacobian fitted from far below carries little of the prompt. Read it from
  the middle layers on.
- The top layer has no J (J = I there), so both lenses agree on it by construction.
"""

NO_LENS = """
### No Jacobian lens is loaded

This tab compares the logit lens with a **Jacobian lens**, a set of pre-fitted matrices that belongs to
one model. None was configured when the app started, so there is nothing to show here.

To load one, restart the app with `--jlens`:

- a lens file for this model: `python app.py --jlens path/to/lens.pt`
  (make one with `python -m lensapp fit ...`, or use the shipped `assets/smollm2-135m-instruct_jlens.pt`
  for the embedded model);
- a published lens on the Hugging Face hub, with `--model Qwen/Qwen3-8B`:
  `--jlens neuronpedia/jacobian-lens:qwen3-8b/jlens/Salesforce-wikitext/Qwen3-8B_jacobian_lens.pt`.

The same setting can come from the environment: `LENSAPP_JLENS=...`.
"""


def build_jacobian_tab(engine, cfg, exports: Exports) -> TabParts:
    d = View()
    with gr.Tab("Jacobian lens", id="jacobian"):
        if engine.jlens is None:
            gr.Markdown(NO_LENS + (f"\n\nThe lens could not be loaded: {md_text(engine.jlens_error)}"
                                   if engine.jlens_error else ""), elem_id="jlens-missing")
            return TabParts("jacobian", {}, lambda: View(tab="jacobian"))
        jl = engine.jlens_layers
        gr.Markdown("What each layer is disposed to say, transported to the last layer by a fitted Jacobian, "
                    "next to the plain logit lens.")
        for warning in engine.jlens.warnings:
            gr.Markdown(f"**Note:** {md_text(warning)}.", elem_classes=["lens-warning"])
        with gr.Accordion("How to read this", open=False):
            gr.Markdown(HOW_TO)
        prompt, targets, layers, k, metric, chat = lens_inputs(
            "jacobian", d, f"Layers (all, a range like 20-29 or a list; these have a J: {_span(jl)})")
        run_button = gr.Button("Run both lenses", variant="primary", elem_id="jacobian-run")
        examples = lens_examples(prompt, targets)
        summary = gr.Markdown(elem_id="jacobian-summary")
        pair = gr.Plot(label="Jacobian lens | logit lens", elem_id="jacobian-heatmap", elem_classes=["lens-plot"],
                       show_label=False)
        diff = gr.Plot(label="Where the top-1 differs", elem_id="jacobian-diff", elem_classes=["lens-plot"],
                       show_label=False)
        position = gr.Dropdown(label="Token table: position", choices=[], interactive=True,
                               elem_id="jacobian-position")
        table = gr.Dataframe(label="Top-k at this position, both lenses, every J layer", interactive=False, wrap=True,
                             elem_id="jacobian-table")
        curves = gr.Plot(label="Targets across layers (solid: J-lens, dashed: logit lens)", visible=False,
                         elem_classes=["lens-plot"], show_label=False)
        with gr.Row():
            csv_file = gr.DownloadButton("Download CSV", visible=False, size="sm")
            json_file = gr.DownloadButton("Download JSON", visible=False, size="sm")
        with gr.Accordion("Lens provenance", open=False):
            about = engine.jlens.describe()
            gr.JSON(value={**about, "source": lens_source(about["source"])}, label="The lens file",
                    elem_id="jlens-provenance")
        state = gr.State()

    def run(prompt, layers, k, targets, metric, chat):
        words = split_targets(targets)
        if charts.METRICS.get(metric, charts.METRICS["top1_prob"]).needs_target and not words:
            warn("That colour needs a target word; showing top-1 probability instead.")
            metric = "top1_prob"
        req = LensRequest(prompts=(prompt,), lens="both", layers=j_layers(layers), k=to_int(k, "k"),
                          targets=words, chat=bool(chat))
        result = call_engine(engine.lens, req)[0]
        last = len(result.input_ids) - 1
        return (
            result,
            charts.lens_pair(result, metric if metric in charts.METRICS else "top1_prob"),
            charts.lens_diff(result),
            lens_summary(result, ("jacobian", "logit")),
            gr.Dropdown(choices=position_choices(result.input_tokens), value=last),
            both_tables(result, last),
            gr.Plot(value=charts.target_curves(result, ("jacobian", "logit")) if words else None, visible=bool(words)),
            gr.DownloadButton(value=exports.write("jacobian-lens", ".csv", result.to_csv()), visible=True),
            gr.DownloadButton(value=exports.write("jacobian-lens", ".json",
                                                  json.dumps(result.to_json(), ensure_ascii=False)), visible=True),
        )

    outputs = [state, pair, diff, summary, position, table, curves, csv_file, json_file]
    inputs = [prompt, layers, k, targets, metric, chat]
    run_button.click(run, inputs, outputs, **PRIVATE)
    prompt.submit(run, inputs, outputs, **PRIVATE)
    examples.load_input_event.then(run, inputs, outputs, **PRIVATE)
    def show_position(result, pos):
        return gr.skip() if result is None or pos is None else both_tables(result, int(pos))

    position.input(show_position, [state, position], table, **PRIVATE)

    def j_layers(text: str) -> str:
        """The layers the user asked for that have a J: a range means the J layers inside it."""
        text = (text or "all").strip()
        wanted = call_engine(parse_layers, text, engine.info.n_layers)
        have = [layer for layer in wanted if layer in jl]
        if not have:
            raise gr.Error(html.escape(f"None of layers {text!r} has a Jacobian lens; it covers {_span(jl)}."))
        named = {int(p) for p in text.replace(" ", "").split(",") if p.lstrip("-").isdigit()}
        missing = sorted({x % engine.info.n_layers for x in named} - set(jl))
        if missing:
            warn(f"Layers {', '.join(map(str, missing))} have no Jacobian lens; showing the others.")
        return ",".join(map(str, have))

    def to_view(prompt, layers, k, targets, metric, chat) -> View:
        return View(tab="jacobian", prompt=prompt or "", layers=layers or "all", k=int_or(k, d.k),
                    targets=targets or "", metric=metric or d.metric, chat=bool(chat))

    fields = {"prompt": prompt, "layers": layers, "k": k, "targets": targets, "metric": metric, "chat": chat}
    return TabParts("jacobian", fields, to_view, run, inputs, outputs, run_button, examples)


def both_tables(result, position: int) -> pd.DataFrame:
    frames = []
    for lens in ("jacobian", "logit"):
        frames.append(result.top_k_table(lens, position).assign(lens=charts.LENS_TITLES[lens]))
    df = pd.concat(frames, ignore_index=True)
    df = df[["lens"] + [c for c in df.columns if c != "lens"]]
    return charts.display_tokens(df)


def _span(layers: list[int]) -> str:
    if len(layers) > 2 and layers == list(range(layers[0], layers[-1] + 1)):
        return f"{layers[0]}..{layers[-1]}"
    return ", ".join(map(str, layers))

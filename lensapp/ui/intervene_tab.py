"""The Intervene tab: steer, ablate or patch a layer's output, then read the lenses before and after.

The readout before and after each change (a steering strength, or a layer of a patch sweep) side by side on
one colour scale, their difference, the word's probability by layer before and after, the dose-response
curve of the sweep, and the text generated with and without the change. For a patch, the source's and the
target's top-1 tables pick the cells: a click on the source table chooses the source position (and the
layer), a click on the target's the position it is copied to.
"""

from __future__ import annotations

import gradio as gr
import pandas as pd

from .. import charts
from ..charts import intervention as ichart
from ..config import MAX_GENERATE_TOKENS, MAX_K, MAX_SEED, MAX_TEMPERATURE
from ..service import InterveneRequest
from ..service import fields as f
from ..snippets import intervention_snippet, model_reference
from .downloads import Downloads
from .lens_tab import colour_metric
from .permalinks import View, as_text, view_of
from .tabs import PRIVATE, TabParts, build_chart, int_or, lens_choices, md_text

HOW_TO = """
**Steer** adds a direction to the residual stream leaving a layer: the direction in which the lens reads
*your word* more strongly. Its length is *alpha* times that layer's typical residual norm (shown), so an
alpha means the same at every layer; several alphas make a **dose-response** sweep. The direction is the
word's row of the unembedding through the final norm's scale (*logit*), the same carried back through the
layer's Jacobian (*jacobian*: what the Jacobian lens reads), the difference of two words' directions
(*from*: steer from one word to the other), or a vector **fitted** by gradient descent on the transformers
backend to make the model say the word.

**Ablate** removes the component along the word's direction at every layer of the span (*project*), or
sets it to its average over a reference text (*mean*). If the model's answer drops, that direction carried it.

**Patch** copies the residual stream at some positions of a *source* prompt into the same layer of this
prompt, one layer at a time over the span. If the answer moves toward the source's, those cells carried it.

Each change runs inside this request's own trace on the engine, batched with everyone else's and changing
nobody else's. The heatmaps share one colour scale; the difference is *after − before* of the word's
probability (a `*` marks a cell whose top-1 changed).

*Worked example*: "The capital of France is", steer toward `Rome` at layer `-8` with alphas `0, 0.1, 0.2,
0.4, 0.8`. The model's P(" Rome") climbs from ~0.05% to ~99% and the top layers read Rome; alpha 0 reads
exactly as before.
"""


def build_intervene_tab(service, guard, downloads: Downloads) -> TabParts:
    d = View(tab="intervene")
    choices = lens_choices(service)
    with gr.Tab("Intervene", id="intervene"):
        gr.Markdown("Change what a layer passes on (steer, ablate, patch), then read every lens again: does "
                    "what the lens showed cause the answer?")
        with gr.Accordion("How to read this", open=False):
            gr.Markdown(HOW_TO)
        with gr.Row():
            prompt = gr.Textbox(label="Prompt", value=d.prompt, lines=2, max_lines=6, scale=3,
                                elem_id="intervene-prompt")
            kind = gr.Radio(list(f.KIND.choices), value=d.intervention, label="Intervention",
                            elem_id="intervene-kind")
        with gr.Row():
            word = gr.Textbox(label="Word (steer toward it, or ablate it)", value=d.word, elem_id="intervene-word")
            from_word = gr.Textbox(label="From word (steer from it to the word; optional)", value=d.from_word,
                                   elem_id="intervene-from")
            layer = gr.Textbox(label=f"Layer or span (L or L-L2; this model: 0..{service.info.n_layers - 1})",
                               value=d.layer, elem_id="intervene-layer")
            positions = gr.Textbox(label="Positions changed (all, P or P-P2; -1 is the last)", value=d.positions,
                                   elem_id="intervene-positions")
        with gr.Row():
            alphas = gr.Textbox(label="Alphas (steer: × the layer's typical norm; a sweep)", value=as_text(d.alphas),
                                elem_id="intervene-alphas")
            direction = gr.Radio(list(f.DIRECTION.choices), value=d.direction, label="Direction",
                                 elem_id="intervene-direction")
            objective = gr.Radio(list(f.OBJECTIVE.choices), value=d.objective, label="Fitted: make read the word by",
                                 elem_id="intervene-objective")
            ablation = gr.Radio(list(f.ABLATION.choices), value=d.ablation, label="Ablation",
                                elem_id="intervene-ablation")
        with gr.Row():
            source = gr.Textbox(label="Patch: source prompt (its cells are copied in)", value=d.source, scale=3,
                                elem_id="intervene-source")
            source_positions = gr.Textbox(label="Patch: source positions (empty: aligned at the end)",
                                          value=d.source_positions, elem_id="intervene-source-positions")
        with gr.Accordion("Reading and generating", open=False):
            with gr.Row():
                lens = gr.Radio(choices, value=d.lens, label="Lens", elem_id="intervene-lens")
                layers = gr.Textbox(label="Layers read", value=d.layers, elem_id="intervene-layers")
                k = gr.Number(label="Top-k", value=d.k, minimum=1, maximum=MAX_K, precision=0, elem_id="intervene-k")
                targets = gr.Textbox(label="More target words (comma-separated)", value=as_text(d.targets),
                                     elem_id="intervene-targets")
                metric = gr.Dropdown(label="Colour cells by", value=d.metric, elem_id="intervene-metric",
                                     choices=[(m.title, key) for key, m in charts.METRICS.items()])
            with gr.Row():
                new_tokens = gr.Slider(0, MAX_GENERATE_TOKENS, value=d.new_tokens, step=1,
                                       label="Generate this many tokens before and after (0: none)",
                                       elem_id="intervene-new-tokens")
                temperature = gr.Slider(0.0, MAX_TEMPERATURE, value=d.temperature, step=0.05, label="Temperature")
                seed = gr.Number(label="Seed (empty: 0)", value=d.seed, minimum=0, maximum=MAX_SEED, precision=0)
                prompt_only = gr.Checkbox(label="Steer the prompt only, not generated tokens", value=d.prompt_only)
                reference = gr.Textbox(label="Mean ablation: reference text (empty: a built-in paragraph)",
                                       value=d.reference)
                chat = gr.Checkbox(label="Wrap in the chat template", value=d.chat)
                raw = gr.Checkbox(label="Raw logits", value=d.raw)
        run_button = gr.Button("Intervene and read again", variant="primary", elem_id="intervene-run",
                               elem_classes=["run"])
        summary = gr.Markdown(elem_id="intervene-summary")
        with gr.Row():
            change = gr.Dropdown(label="Show the change", choices=[], interactive=True, elem_id="intervene-change")
            shown_lens = gr.Radio(choices[:2], value="logit", label="Lens shown", visible=len(choices) > 1,
                                  elem_id="intervene-shown-lens")
        pair = gr.Plot(elem_id="intervene-pair", elem_classes=["lens-plot"], show_label=False)
        diff = gr.Plot(elem_id="intervene-diff", elem_classes=["lens-plot"], show_label=False)
        with gr.Row():
            dose = gr.Plot(elem_id="intervene-dose", elem_classes=["lens-plot"], show_label=False, visible=False)
            by_layer = gr.Plot(elem_id="intervene-by-layer", elem_classes=["lens-plot"], show_label=False)
        generated = gr.Markdown(elem_id="intervene-generated")
        with gr.Accordion("Patch: pick the cells", open=False, visible=False) as picker:
            gr.Markdown("Click a cell of the source's table to copy from its position (at its layer); click a "
                        "column of the target's to copy into that position. Then run again.")
            source_table = gr.Dataframe(label="Source: top-1 by layer (rows) and position (columns)",
                                        interactive=False, wrap=True, elem_id="intervene-source-table")
            target_table = gr.Dataframe(label="Target: top-1 by layer and position, before", interactive=False,
                                        wrap=True, elem_id="intervene-target-table")
        state = gr.State()
        csv_file, json_file = downloads.buttons("intervention", state)
        with gr.Accordion("Show the code", open=False):
            code = gr.Code(language="python", interactive=False, elem_id="intervene-code")

    names = ("prompt", "intervention", "word", "layer", "alphas", "direction", "from_word", "objective", "positions",
             "prompt_only", "ablation", "reference", "source", "source_positions", "lens", "layers", "k", "targets",
             "metric", "new_tokens", "temperature", "seed", "chat", "raw")
    components = [prompt, kind, word, layer, alphas, direction, from_word, objective, positions, prompt_only,
                  ablation, reference, source, source_positions, lens, layers, k, targets, metric, new_tokens,
                  temperature, seed, chat, raw]

    def readout(*values, progress=None):
        v = dict(zip(names, values))
        metric_name = v.pop("metric")
        if v["lens"] not in {value for _, value in choices}:
            v["lens"] = "logit"
        req = InterveneRequest.parse(**v)
        result = service.intervene(req, progress)
        lens_shown = "jacobian" if "jacobian" in result.before.lenses else "logit"
        last = len(result.after) - 1
        patch = req.intervention == "patch"
        return (
            result,
            summarise(result),
            gr.Dropdown(choices=[(label, i) for i, label in enumerate(result.labels)], value=last),
            gr.Radio(value=lens_shown),
            *draw(result, last, lens_shown, colour_metric(metric_name, result.before.lenses[lens_shown].targets)),
            gr.Plot(value=build_chart(ichart.dose_response, result) if result.sweep and result.word else None,
                    visible=bool(result.sweep and result.word)),
            generated_text(result),
            gr.Accordion(visible=patch, open=patch),
            top1_table(result.source) if patch else gr.skip(),
            top1_table(result.before) if patch else gr.skip(),
            gr.Button(visible=True),                 # the downloads: built from `result` when asked for
            gr.Button(visible=True),
            code_for(service, result),
        )

    def draw(result, index, lens, metric):
        by = (build_chart(ichart.word_across_layers, result, index, lens) if result.word else None)
        return (build_chart(ichart.before_after, result, index, lens, metric),
                build_chart(ichart.difference, result, index, lens), by)

    def run(*values, request: gr.Request = None, progress=gr.Progress()):
        def heard(step, p, norm):
            if step < 0:                                  # waiting its turn at the fitting desk (service/fits.py)
                progress(0.0, desc=f"waiting for the fitter: {-step} fit{'s' if step < -1 else ''} ahead")
                return
            progress(min(1.0, step / max(1, service.cfg.max_fit_steps)),
                     desc=f"fitting the steering vector: step {step}, P(word) {p:.2f}")
        return guard.ui(request, readout, *values, progress=heard)

    outputs = [state, summary, change, shown_lens, pair, diff, by_layer, dose, generated, picker, source_table,
               target_table, csv_file, json_file, code]
    run_button.click(run, components, outputs, **PRIVATE)
    prompt.submit(run, components, outputs, **PRIVATE)

    def show_change(result, index, lens, metric):
        index = int_or(index, -1)
        if result is None or not 0 <= index < len(result.after):
            return gr.skip(), gr.skip(), gr.skip()
        lens = lens if isinstance(lens, str) and lens in result.before.lenses else next(iter(result.before.lenses))
        return draw(result, index, lens, colour_metric(metric, result.before.lenses[lens].targets, quiet=True))

    def pick_change(result, index, lens, metric, request: gr.Request = None):
        return guard.ui(request, show_change, result, index, lens, metric)

    gr.on([change.input, shown_lens.input], pick_change, [state, change, shown_lens, metric], [pair, diff, by_layer],
          **PRIVATE)

    def pick_source(result, evt: gr.SelectData):
        """A click on the source table: (its layer, its position)."""
        if result is None or result.source is None or evt is None or not evt.index:
            return gr.skip(), gr.skip()
        row, col = evt.index
        layers = result.source.layers[::-1]
        if not (0 <= row < len(layers) and 1 <= col <= len(result.source.input_ids)):
            return gr.skip(), gr.skip()
        return str(layers[row]), str(col - 1)

    def pick_target(result, evt: gr.SelectData):
        if result is None or evt is None or not evt.index or not 1 <= evt.index[1] <= len(result.before.input_ids):
            return gr.skip()
        return str(evt.index[1] - 1)

    source_table.select(pick_source, state, [layer, source_positions], **PRIVATE)
    target_table.select(pick_target, state, positions, **PRIVATE)

    fields = dict(zip(names, components))
    return TabParts("intervene", fields, lambda *values: view_of("intervene", **dict(zip(fields, values))), run,
                    components, outputs, run_button,
                    handlers={"show_change": pick_change, "pick_source": pick_source, "pick_target": pick_target})


def code_for(service, result) -> str:
    """The intervention as a runnable nnsight script (snippets.py)."""
    if result.intervention.get("direction") == "jacobian" and service.jlens is None:
        return ""
    model, note = model_reference(service.cfg.model, service.info.name)
    return intervention_snippet(family=service.model.family, model=model, prompt=result.before.prompt,
                                intervention=result.intervention, model_note=note,
                                jlens=service.jlens.describe()["source"] if service.jlens is not None else None)


def summarise(result) -> str:
    """Markdown: what was done, the layer's typical norm, the model's next token before and after."""
    i = result.intervention
    lines = [f"**{i['kind'].capitalize()}** at layer{'s' if len(i['layers']) > 1 else ''} "
             f"{', '.join(map(str, i['layers']))}, positions {md_text(str(i['positions']))}"]
    if i.get("word"):
        lines[0] += f", word {md_text(charts.show_token(i['word']))} ({i.get('direction')} direction)"
    if i.get("typical_norm"):
        lines.append("Typical residual norm there: " + ", ".join(f"layer {layer}: {n:.3g}"
                                                                  for layer, n in i["typical_norm"].items())
                     + " (alpha 1 adds a vector that long).")
    if i.get("fit"):
        fit = i["fit"]
        lines.append(f"Fitted vector: P = {fit['p']:.3f} after {fit['steps']} steps ({fit['stopped']}); its own "
                     f"length is alpha {fit['alpha']:.3g}.")
    if i.get("source"):
        lines.append(f"Copied from {md_text(repr(i['source']))}, positions {i['source_positions']} into "
                     f"{i['target_positions']}.")
    nexts = ", ".join(f"{md_text(label)}: {md_text(charts.show_token(a.model_next_token))}"
                      for label, a in zip(result.labels, result.after))
    lines.append(f"The model's next token before: **{md_text(charts.show_token(result.before.model_next_token))}**; "
                 f"after {nexts}.")
    return "\n\n".join(lines)


def generated_text(result) -> str:
    if not result.generated_after:
        return ""
    rows = [f"- before: {md_text(result.generated_before)}"]
    rows += [f"- {md_text(label)}: {md_text(text)}" for label, text in zip(result.labels, result.generated_after)]
    return "**Generated, with the same seed:**\n" + "\n".join(rows)


def top1_table(result) -> pd.DataFrame:
    """Top-1 token per layer (rows, the last layer first) and position (columns), as text: the heatmap's
    cells in a table a click (or a screen reader) can use."""
    grid = result.top1_grid(next(iter(result.lenses)))
    table = grid.iloc[::-1].map(charts.show_token)
    table.columns = [f"{i}: {charts.clip(charts.show_token(t), 12)}" for i, t in enumerate(result.input_tokens)]
    table.insert(0, "layer", list(grid.index[::-1]))
    return table



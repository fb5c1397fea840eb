"""The Intervene tab: steer, ablate or patch a layer's output, then read the lenses before and after.

The readout before and after each change (a steering strength, or a layer of a patch sweep) side by side on
one colour scale, their difference, the word's probability by layer before and after, the dose-response
curve of the sweep, and the text generated with and without the change. For a patch, the source's and the
target's top-1 tables pick the cells: a click on the source table chooses the source position (and the
layer), a click on the target's the position it is copied to. Its inputs are the `intervene` request's
fields (`views.TAB_VIEWS`); the handlers below are what its events call.
"""

from __future__ import annotations

import dataclasses
from functools import partial

import gradio as gr
import pandas as pd

from .. import charts, lens_kinds
from ..charts import intervention as ichart
from ..lens_kinds import LOGIT
from ..results import AblateDone, PatchDone, SteerDone
from ..service import fields as f
from ..service.selection import Selection
from ..snippets import model_reference
from ..snippets.intervention import intervention_snippet
from .downloads import Downloads
from .first_view import FIRST_CHART, PHONE_LATER
from .form import Form, add_reading, asked, single_lenses
from .kept import Kept, kept_state, recipe
from .readout import colour_metric
from .tabs import Components, TabParts, build_chart, how_to, int_or, md_text, on
from .views import TAB_VIEWS, TabView

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


# The fields each kind reads (service/intervening/<kind>.py); while a kind is chosen the others' are hidden. Layer,
# positions and the reading are every kind's. Some show only for one choice of another field (`WHEN`).
KIND_FIELDS = {"steer": ("word", "from_word", "direction", "alphas", "objective", "prompt_only"),
               "ablate": ("word", "from_word", "direction", "ablation", "reference"),
               "patch": ("source", "source_positions")}
WHEN = {"objective": ("direction", "fitted"), "reference": ("ablation", "mean")}
SWITCHES = ("intervention", "direction", "ablation")


def fields_shown(values: dict, request: gr.Request = None) -> dict:
    """Each kind's field shown or hidden for the `SWITCHES`' values (a kind this tab does not know: all shown)."""
    own = KIND_FIELDS.get(values.get("intervention"), {n for names in KIND_FIELDS.values() for n in names})
    out = {}
    for name in {n for names in KIND_FIELDS.values() for n in names}:
        by, needs = WHEN.get(name, (None, None))
        out[name] = gr.update(visible=name in own and (by is None or values.get(by) == needs))
    return out


def build_intervene_tab(service, guard, downloads: Downloads, view: TabView = TAB_VIEWS["intervene"]) -> TabParts:
    with gr.Tab("Intervene", id=view.name):
        gr.Markdown("Change what a layer passes on (steer, ablate, patch), then read every lens again: does "
                    "what the lens showed cause the answer?")
        how_to(HOW_TO)
        form = Form(view, service)
        _inputs(form, service)
        run_button = gr.Button("Intervene and read again", variant="primary", elem_id=f"{view.name}-run",
                               elem_classes=["run"])
        outputs = _outputs(view, service, downloads)
    parts = {**form.inputs, **outputs}
    run_fn = partial(run, view, service, guard)
    on([run_button.click, form.inputs["prompt"].submit], run_fn, parts, form.inputs, outputs, progress=True)
    on([parts[name].change for name in SWITCHES], fields_shown, parts, SWITCHES, fields_shown({}).keys(),
       queue=False)
    on([parts["change"].input, parts["shown_lens"].input], partial(show_change, guard), parts,
       ["state", "change", "shown_lens", "metric"], ["pair", "diff", "by_layer"])
    on(parts["source_table"].select, pick_source, parts, ["state"], ["layer", "source_positions"], select=True)
    on(parts["target_table"].select, pick_target, parts, ["state"], ["positions"], select=True)
    return TabParts(view, form.inputs, outputs, run_fn, run_button=run_button)


def _inputs(form: Form, service) -> None:
    shown = {name: update["visible"] for name, update in fields_shown(form.values).items()}

    def add(name: str, **props):
        form.add(name, visible=shown.get(name, True), **props)

    with gr.Row():
        form.add("prompt", lines=2, max_lines=6, scale=3)
        form.add("intervention", elem_id="intervene-kind")
    with gr.Row(elem_classes=[PHONE_LATER]):             # on a phone, after the picture (first_view.py)
        add("word")
        add("from_word", elem_id="intervene-from")
        add("source", scale=3)
        add("source_positions")
        add("layer", label=f"Layer or span (L or L-L2; this model: 0..{service.info.n_layers - 1})")
        add("positions")
    with gr.Row(elem_classes=[PHONE_LATER]):
        for name in ("alphas", "direction", "objective", "ablation"):
            add(name)
    with gr.Accordion("Reading and generating", open=False, elem_classes=[PHONE_LATER]):
        with gr.Row():
            add_reading(form, layers="Layers read", targets="More target words (comma-separated)")
            form.add("metric")
        with gr.Row():
            form.add("new_tokens")
            form.add("temperature", label="Temperature")
            form.add("seed", label="Seed (empty: 0)")
            add("prompt_only")
            add("reference")
            form.add("chat", label="Wrap in the chat template")
            form.add("raw", info=None)
            form.rest()


def _outputs(view: TabView, service, downloads: Downloads) -> Components:
    """What an intervention writes, by name."""
    out = {"summary": gr.Markdown(elem_id=f"{view.name}-summary")}
    lenses = single_lenses(service)
    with gr.Row():
        out["change"] = gr.Dropdown(label="Show the change", choices=[], interactive=True, elem_id="intervene-change")
        out["shown_lens"] = gr.Radio(lenses, value=LOGIT.name, label="Lens shown", visible=len(lenses) > 1,
                                     elem_id="intervene-shown-lens")
    out["pair"] = gr.Plot(elem_id="intervene-pair", elem_classes=["lens-plot", FIRST_CHART], show_label=False)
    out["diff"] = gr.Plot(elem_id="intervene-diff", elem_classes=["lens-plot"], show_label=False)
    # One under the other: side by side, each had half the width and the wider was cut off at the right edge.
    out["dose"] = gr.Plot(elem_id="intervene-dose", elem_classes=["lens-plot"], show_label=False, visible=False)
    out["by_layer"] = gr.Plot(elem_id="intervene-by-layer", elem_classes=["lens-plot"], show_label=False)
    out["generated"] = gr.Markdown(elem_id="intervene-generated")
    with gr.Accordion("Patch: pick the cells", open=False, visible=False) as out["picker"]:
        gr.Markdown("Click a cell of the source's table to copy from its position (at its layer); click a "
                    "column of the target's to copy into that position. Then run again.")
        out["source_table"] = gr.Dataframe(label="Source: top-1 by layer (rows) and position (columns)",
                                           interactive=False, wrap=True, elem_id="intervene-source-table")
        out["target_table"] = gr.Dataframe(label="Target: top-1 by layer and position, before", interactive=False,
                                           wrap=True, elem_id="intervene-target-table")
    out["state"] = kept_state()
    out.update(downloads.buttons("intervention", out["state"]))
    with gr.Accordion("Show the code", open=False):
        out["code"] = gr.Code(language="python", interactive=False, elem_id="intervene-code")
    return out


def run(view: TabView, service, guard, values: dict, request: gr.Request = None, progress=None) -> dict:
    """The intervention the inputs' `values` (by name) ask, through the guard; `progress` hears a fit's steps."""
    def heard(step, p, norm):
        if progress is None:
            return
        if step < 0:                                  # waiting its turn at the fitting desk (service/fits.py)
            progress(0.0, desc=f"waiting for the fitter: {-step} fit{'s' if step < -1 else ''} ahead")
            return
        progress(min(1.0, step / max(1, service.cfg.fits.max_fit_steps)),
                 desc=f"fitting the steering vector: step {step}, P(word) {p:.2f}")
    return guard.ui(request, readout, view, service, values, heard)


def readout(view: TabView, service, values: dict, progress=None) -> dict:
    req = asked(view, service, values)
    result = service.intervene(req, progress)
    lens = shown_lens(result)
    last = len(result.after) - 1
    patch = req.intervention == "patch"
    shown = result.sweep and result.word
    metric = colour_metric(values.get("metric"), result.before.lenses[lens].targets)
    return {
        "state": Kept(result, recipe(view.kind, req)), "summary": summarise(result),
        "change": gr.Dropdown(choices=[(label, i) for i, label in enumerate(result.labels)], value=last),
        "shown_lens": gr.Radio(value=lens), **draw(result, last, lens, metric),
        "dose": gr.Plot(value=build_chart(ichart.dose_response, result) if shown else None, visible=bool(shown)),
        "generated": generated_text(result),
        "picker": gr.Accordion(visible=patch, open=patch),
        "source_table": top1_table(result.source) if patch else gr.skip(),
        "target_table": top1_table(result.before) if patch else gr.skip(),
        **Downloads.shown(),
        "code": code_for(service, result, req.chat),
    }


def shown_lens(result) -> str:
    """The lens a result is shown through first: the Jacobian lens, if it was read."""
    return min(result.before.lenses, key=lambda name: not lens_kinds.lens(name).reads_jlens)


def picture(req, values: dict, result):
    """The tab's first chart for `values` (the request they ask, `req`, made `result`): `readout`'s, and a link's
    first view's (`first_view.py`)."""
    lens = shown_lens(result)
    metric = colour_metric(values.get("metric"), result.before.lenses[lens].targets, quiet=True)
    return build_chart(ichart.before_after, result, len(result.after) - 1, lens, metric)     # `draw`'s "pair"


def first_read(service, req):
    """The request that reads only what `picture` draws of `req` (the readout before and its last change), when
    `req` reads more: a steering sweep's last alpha, a patch's last layer, no texts generated. A link's page draws
    its picture from it while the whole sweep is read (`prefetch.py`), as a long prompt's drawn window is read
    first (`lens_tab.first_read`). Every readout is its own trace, so the part's cells are the whole's. None:
    `req` reads no more than that (one change, an ablation, a fitted vector)."""
    if req.intervention == "steer" and req.direction != "fitted":
        alphas = req.alphas or f.DEFAULT_ALPHAS
        shown = dataclasses.replace(req, alphas=alphas[-1:]) if len(alphas) > 1 else None
    elif req.intervention == "patch":
        span = req.layer.resolve(service.info.n_layers)
        shown = dataclasses.replace(req, layer=Selection(str(span[-1]))) if len(span) > 1 else None
    else:
        shown = None
    return None if shown is None else dataclasses.replace(shown, new_tokens=0)


def draw(result, index: int, lens: str, metric: str) -> dict:
    by_layer = build_chart(ichart.word_across_layers, result, index, lens) if result.word else None
    return {"pair": build_chart(ichart.before_after, result, index, lens, metric),
            "diff": build_chart(ichart.difference, result, index, lens), "by_layer": by_layer}


def show_change(guard, values: dict, request: gr.Request = None) -> dict:
    """The charts of the chosen change, in the chosen lens (none chosen, or not one of them: unchanged)."""
    def charts_of():
        result, index, lens = values["state"], int_or(values["change"], -1), values["shown_lens"]
        if result is None or not 0 <= index < len(result.after):
            return {}
        lens = lens if isinstance(lens, str) and lens in result.before.lenses else next(iter(result.before.lenses))
        return draw(result, index, lens, colour_metric(values["metric"], result.before.lenses[lens].targets,
                                                       quiet=True))
    return guard.ui(request, charts_of)


def pick_source(values: dict, evt: gr.SelectData) -> dict:
    """A click on the source table: its layer and its position."""
    result = values["state"]
    if result is None or result.source is None or evt is None or not evt.index:
        return {}
    row, col = evt.index
    layers = result.source.layers[::-1]
    if not (0 <= row < len(layers) and 1 <= col <= len(result.source.input_ids)):
        return {}
    return {"layer": str(layers[row]), "source_positions": str(col - 1)}


def pick_target(values: dict, evt: gr.SelectData) -> dict:
    """A click on the target table: the position cells are copied into."""
    result = values["state"]
    if result is None or evt is None or not evt.index or not 1 <= evt.index[1] <= len(result.before.input_ids):
        return {}
    return {"positions": str(evt.index[1] - 1)}


def code_for(service, result, chat: bool = False) -> str:
    """The intervention as a runnable nnsight script (snippets/intervention.py), its prompts in the chat template
    when `chat`."""
    jacobian = isinstance(result.intervention, (SteerDone, AblateDone)) and result.intervention.direction == "jacobian"
    if jacobian and service.jlens is None:
        return ""
    model, note = model_reference(service.cfg.engine.model, service.info.name)
    return intervention_snippet(family=service.model.family, model=model, prompt=result.before.prompt,
                                intervention=result.intervention, model_note=note, bos=service.prompts.bos, chat=chat,
                                jlens=service.jlens.describe()["source"] if service.jlens is not None else None)


def summarise(result) -> str:
    """Markdown: what was done, the layer's typical norm, the model's next token before and after."""
    done = result.intervention
    lines = [f"**{done.kind.capitalize()}** at layer{'s' if len(done.layers) > 1 else ''} "
             f"{', '.join(map(str, done.layers))}, positions {md_text(str(done.positions))}"]
    if isinstance(done, (SteerDone, AblateDone)) and done.word:
        lines[0] += f", word {md_text(charts.show_token(done.word))} ({done.direction} direction)"
    if isinstance(done, SteerDone):
        lines.append("Typical residual norm there: " + ", ".join(f"layer {layer}: {n:.3g}"
                                                                  for layer, n in done.typical_norm.items())
                     + " (alpha 1 adds a vector that long).")
        if done.fit is not None:
            fit = done.fit
            lines.append(f"Fitted vector: P = {fit.p:.3f} after {fit.steps} steps ({fit.stopped}); its own "
                         f"length is alpha {fit.alpha:.3g}.")
    if isinstance(done, PatchDone):
        lines.append(f"Copied from {md_text(repr(done.source))}, positions {list(done.source_positions)} into "
                     f"{list(done.target_positions)}.")
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
    return f"**Generated, with the same seed ({result.seed}):**\n" + "\n".join(rows)


def top1_table(result) -> pd.DataFrame:
    """Top-1 token per layer (rows, the last layer first) and position (columns), as text: the heatmap's
    cells in a table a click (or a screen reader) can use."""
    grid = result.top1_grid(next(iter(result.lenses)))
    table = grid.iloc[::-1].map(charts.show_token)
    table.columns = [f"{i}: {charts.clip(charts.show_token(t), 12)}" for i, t in enumerate(result.input_tokens)]
    table.insert(0, "layer", list(grid.index[::-1]))
    return table



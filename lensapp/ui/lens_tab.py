"""The logit-lens and Jacobian-lens tabs: one builder, configured for each.

Both show a layer x token heatmap for a prompt, the top-k table at one position and the target
curves. The Jacobian tab reads both lenses over the layers that have a J, shows them side by side
on one colour scale with a view of where their top-1 differs, and the lens's provenance. Its inputs
are the `lens` request's fields but the lens (`views.TAB_VIEWS`); the handlers below are what its
events call. Under the readout: a cell described in words (`describing.py`), "Show the code"
(`lens_code.py`) and, on the Jacobian tab, how good the lens is (`evaluation.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial

import gradio as gr

from .. import charts, redact
from ..service.asks import asking
from ..service.planning import jlens_subset
from ..service.selection import span
from .components_tab import cell_link
from .decisions import build_strip, redraw_strip, strip_of
from .describing import build_describe_panel, describe
from .downloads import Downloads
from .evaluation import build_evaluation_panel
from .examples import lens_examples
from .first_view import FIRST_CHART, PHONE_LATER
from .form import Form, asked
from .kept import Kept, kept_state, recipe
from .lens_code import build_code_panel, show_code
from .lens_texts import (
    JACOBIAN_HOW_TO,
    JACOBIAN_INTRO,
    LOGIT_HOW_TO,
    LOGIT_INTRO,
    NO_LENS,
    RAW_INFO,
    SUBLAYERS_INFO,
)
from .notes import highlight_of
from .readout import colour_metric, grid_tables, lens_summary, position_choices, shown_lenses, top_k_tables
from .tabs import Components, TabParts, build_chart, how_to, int_or, md_text, on, warn
from .views import START, TAB_VIEWS, TabView


@dataclass(frozen=True)
class LensTab:
    view: TabView           # what its link carries (its name: the permalink's tab id and elem-id prefix)
    title: str
    intro: str
    how_to: str
    lens: str               # what the request reads: "logit" or "both"
    run_label: str

    @property
    def name(self) -> str:
        return self.view.name

    @property
    def shown(self) -> tuple[str, ...]:
        """The lenses its charts and tables show, in their order."""
        return shown_lenses(self.lens)


LOGIT_TAB = LensTab(TAB_VIEWS["logit"], "Logit lens", LOGIT_INTRO, LOGIT_HOW_TO, "logit", "Run logit lens")
JACOBIAN_TAB = LensTab(TAB_VIEWS["jacobian"], "Jacobian lens", JACOBIAN_INTRO, JACOBIAN_HOW_TO, "both",
                       "Run both lenses")
LENS_TABS = {tab.name: tab for tab in (LOGIT_TAB, JACOBIAN_TAB)}


def lens_request(tab: LensTab, service, values: dict):
    """The request `tab` sends for its inputs' `values` (by name), read by the fields' parsers, and the
    asked-for layers left out for having no J (the page and a link's prefetch, `ui.prefetch`, send the same)."""
    req = asked(tab.view, service, values, lens=tab.lens)
    if tab.lens == "logit":
        return req, []
    have, missing = jlens_subset(req.layers, service.info.n_layers, service.jlens_layers)
    return replace(req, layers=",".join(map(str, have))), missing


def build_lens_tab(tab: LensTab, service, guard, downloads: Downloads, note: gr.Textbox | None = None) -> TabParts:
    """note: the link's note box (its references outline cells), when the page has one."""
    with gr.Tab(tab.title, id=tab.name):
        if tab.lens != "logit" and service.jlens is None:
            gr.Markdown(NO_LENS + (f"\n\nThe lens could not be loaded: {md_text(redact.paths(service.jlens_error))}"
                                   if service.jlens_error else ""), elem_id="jlens-missing")
            return TabParts(tab.view, {})
        _header(tab, service)
        form = Form(tab.view, service)
        _inputs(tab, form, service)
        run_button = gr.Button(tab.run_label, variant="primary", elem_id=f"{tab.name}-run", elem_classes=["run"])
        with gr.Column(elem_classes=[PHONE_LATER]):
            examples = lens_examples(form.inputs["prompt"], form.inputs["targets"])
        outputs = _outputs(tab, downloads)
        more = _more(tab, service)
        if tab.lens != "logit":                 # how good is each lens: the shipped items, computed once
            build_evaluation_panel(tab.name, service, guard)
    reads = {"note": note} if note is not None else {}
    parts = {**form.inputs, **outputs, **more, **reads}
    run_fn = partial(run, tab, service, guard)
    # A long prompt's first look is its drawn window (`readout`); the rest follows, without a veil over the picture,
    # and a new Run cancels it (else the old prompt's whole readout could land over the new one's first look).
    completing = on(parts["state"].change, partial(complete, tab, service, guard), parts,
                    ["state", *form.inputs, *reads], outputs, show_progress="hidden")
    for trigger in ([run_button.click, form.inputs["prompt"].submit], examples.load_input_event.then):
        on(trigger, run_fn, parts, [*form.inputs, *reads], outputs, cancels=[completing])
    on(parts["position"].input, partial(pick_position, tab, guard), parts, ["state", "position"], ["table", "curves"])
    on(parts["window"].release, partial(move_window, tab, guard), parts, ["state", "metric", "window", "chat", *reads],
       ["heatmap", "diff", "start", "grid_table"])
    on([parts["rule"].input, parts["window"].release], partial(redraw_strip, guard), parts, ["state", "rule", "window"],
       ["strip", "decided"])
    asked_cell = ["state", "position", "chat", *(name for name in more if name.startswith("describe_"))]
    for button, every_layer in (("describe_one", False), ("describe_column", True)):
        on(parts[button].click, partial(describe, service, guard, every_layer), parts, asked_cell, ["describe_table"])
    on([parts["state"].change, parts["code_form"].change], partial(show_code, tab.lens, service, guard), parts,
       ["state", "code_form", "chat"], ["code"])
    return TabParts(tab.view, form.inputs, outputs, run_fn, reads, run_button)


def _header(tab: LensTab, service) -> None:
    gr.Markdown(tab.intro, elem_id=f"{tab.name}-intro")
    for warning in (service.jlens.warnings if tab.lens != "logit" else []):
        gr.Markdown(f"**Note:** {md_text(redact.paths(warning))}.", elem_classes=["lens-warning"])
    how_to(tab.how_to)


def _inputs(tab: LensTab, form: Form, service) -> None:
    layers = (f"Layers (all, a range like 20-29 or a list; these have a J: {span(service.jlens_layers)})"
              if tab.lens != "logit" else f"Layers (all, 10-20 or 0,5,-1; this model: 0..{service.info.n_layers - 1})")
    with gr.Row():
        form.add("prompt", lines=2, max_lines=8, scale=3)
        form.add("targets", scale=2)
    with gr.Row(elem_classes=[PHONE_LATER]):            # on a phone, after the picture (first_view.py)
        form.add("layers", label=layers)
        form.add("k")
        form.add("metric")
        form.add("chat")
        form.add("punct")
        if "sublayers" in form.fields:
            form.add("sublayers", label="Inside each layer", info=SUBLAYERS_INFO)
    with gr.Accordion("Advanced", open=False, elem_classes=[PHONE_LATER]):
        form.add("raw", info=RAW_INFO)
        form.add("start", visible=False)                 # the link's window, if any
        form.rest()


def _outputs(tab: LensTab, downloads: Downloads) -> Components:
    """What a readout writes, by name."""
    out = {"summary": gr.Markdown(elem_id=f"{tab.name}-summary"),
           "window": gr.Slider(0, 1, value=0, step=1, visible=False, label="Positions shown: the first of the window",
                               elem_id=f"{tab.name}-window"),
           "heatmap": gr.Plot(elem_id=f"{tab.name}-heatmap", elem_classes=["lens-plot", FIRST_CHART], show_label=False)}
    out.update(build_strip(tab.name))
    with gr.Accordion("Heatmap as a table", open=False, elem_id=f"{tab.name}-grid-box"):
        out["grid_table"] = gr.HTML(elem_id=f"{tab.name}-grid-table", elem_classes=["grid-table"])
    out["diff"] = gr.Plot(elem_id=f"{tab.name}-diff", elem_classes=["lens-plot"], show_label=False,
                          visible=tab.lens != "logit")
    out["position"] = gr.Dropdown(label="Token table: position", choices=[], interactive=True,
                                  elem_id=f"{tab.name}-position")
    out["table"] = gr.Dataframe(label="Top-k at this position, every layer (p = probability)", interactive=False,
                                wrap=True, elem_id=f"{tab.name}-table")
    out["curves"] = gr.Plot(visible=False, elem_classes=["lens-plot"], show_label=False, elem_id=f"{tab.name}-curves")
    out["state"] = kept_state()
    out.update(downloads.buttons(f"{tab.name}-lens", out["state"]))
    return out


def _more(tab: LensTab, service) -> Components:
    """A cell described in words, the code and the lens's provenance under the readout."""
    described = build_describe_panel(tab.name, service.info.n_layers)
    code = build_code_panel(tab.name)
    if tab.lens != "logit":
        with gr.Accordion("Lens provenance", open=False):
            gr.JSON(value=service.jlens.describe(), label="The lens file", elem_id="jlens-provenance")
    return {**described, **code}


# -- what its events call -------------------------------------------------------------------------------

def run(tab: LensTab, service, guard, values: dict, request: gr.Request = None) -> dict:
    """The readout of the inputs' `values` (and the link's note, when given), through the guard."""
    return guard.ui(request, readout, tab, service, values)


def readout(tab: LensTab, service, values: dict, first_look: bool = True) -> dict:
    """The readout's outputs. A first look at a long prompt reads its drawn window only (`first_read`); then
    `complete` reads it whole (the same picture, its overview filled in, the slider and downloads shown)."""
    req, missing = lens_request(tab, service, values)
    metric = colour_metric(values.get("metric"), req.targets, quiet=not first_look)
    if missing and first_look:
        warn(f"Layers {', '.join(map(str, missing))} have no Jacobian lens; showing the others.")
    start = START(values.get("start"))
    result = service.lens(req, read_from=first_read(service, req, start) if first_look else 0)[0]
    for warning in (result.jlens or {}).get("warnings", []) if first_look else []:    # unlike the lens's fit (BOS)
        if warning not in getattr(service.jlens, "warnings", []):   # those are noted above the tab already
            warn(f"Jacobian lens: {warning}.")
    n, last, whole = len(result.input_ids), len(result.input_ids) - 1, not result.read_from
    cols = charts.window_of(n, start, charts.DisplaySettings())
    heatmap, diff = draw(tab, result, metric, cols.start, values.get("note"), values.get("chat"))
    return {
        "state": Kept(result, recipe(tab.view.kind, req, read_from=result.read_from)), "heatmap": heatmap, "diff": diff,
        "window": gr.Slider(minimum=0, maximum=max(1, n - len(cols)), value=cols.start,
                            visible=whole and len(cols) < n),
        "summary": lens_summary(result, tab.shown) + ("" if whole else READING_THE_REST),
        "position": gr.Dropdown(choices=position_choices(result.input_tokens)[result.read_from:], value=last),
        "table": top_k_tables(result, tab.shown, last),
        "curves": gr.Plot(value=line_charts(result, tab.shown, last), visible=True),
        **(Downloads.shown() if whole else Downloads.hidden()),
        "grid_table": grid_tables(result, tab.shown, cols.start),
        "rule": gr.Radio(value="top1"), **strip_of(result, "top1", cols.start),
    }


READING_THE_REST = "  \n*Reading the rest of the prompt: the slider and the downloads follow in a moment.*"


def first_read(service, req, start: int | None) -> int:
    """Where a first look starts reading: the drawn window's first position (`charts.window_of`), when that
    window and the positions after it are at most half the prompt (a 389-token link reads 48: ~8x fewer cells
    through the unembedding before its picture is drawn); 0, all of it, otherwise."""
    n = len(service.prompts.ids(req.prompts[0], req.chat))
    first = charts.window_of(n, start, charts.DisplaySettings()).start
    return first if 2 * (n - first) <= n else 0


def complete(tab: LensTab, service, guard, values: dict, request: gr.Request = None) -> dict:
    """After a first look (a result with `read_from`), the whole readout of the same request, not counted twice
    in a workshop's usage; nothing for a whole result (not even a request of the visitor's rate: every state
    change calls this), or when the prompt was edited since (its Run reads it)."""
    result = values["state"]
    if result is None or not result.read_from:
        return {}

    def whole():
        if lens_request(tab, service, values)[0].prompts[0] != result.prompt:
            return {}
        with asking(counted=False):
            return readout(tab, service, values, first_look=False)
    return guard.ui(request, whole)


def draw(tab: LensTab, result, metric: str, first, note=None, chat=False) -> tuple:
    """The heatmap(s) of `result` from position `first` (None: the last ones); the cells the link's note
    names outlined; a click on a logit-lens cell opens its components ("who wrote this?")."""
    highlight = highlight_of(note, result.layers)
    if tab.lens != "logit":
        return (build_chart(charts.lens_pair, result, metric, start=first, highlight=highlight),
                build_chart(charts.lens_diff, result, start=first))
    href = cell_link(result.prompt, bool(chat))
    if result.after_attention is not None:
        return build_chart(charts.sublayer_heatmap, result, metric, start=first, href=href), gr.skip()
    return (build_chart(charts.lens_heatmap, result, "logit", metric, start=first, highlight=highlight, href=href),
            gr.skip())


def pick_position(tab: LensTab, guard, values: dict, request: gr.Request = None) -> dict:
    """The top-k table at the chosen position (none chosen, or not one of the choices: unchanged)."""
    def table():
        result, pos = values["state"], int_or(values["position"], -1)
        if result is None or not 0 <= pos < len(result.input_ids):
            return {}
        return {"table": top_k_tables(result, tab.shown, pos), "curves": line_charts(result, tab.shown, pos)}
    return guard.ui(request, table)


def line_charts(result, lenses: tuple[str, ...], position: int):
    """The targets' curves; with no target, the tokens that were top-1 at some layer at `position`."""
    if result.lenses[lenses[0]].targets:
        return build_chart(charts.target_curves, result, lenses)
    return build_chart(charts.top1_curves, result, lenses, position)


def move_window(tab: LensTab, guard, values: dict, request: gr.Request = None) -> dict:
    """Redraw from the result in hand from the window's first position (no new readout); the link keeps it."""
    def redraw():
        result = values["state"]
        if result is None:
            return {}
        metric = colour_metric(values["metric"], result.lenses[tab.shown[0]].targets, quiet=True)
        first = int_or(values["window"], 0)
        heatmap, diff = draw(tab, result, metric, first, values.get("note"), values.get("chat"))
        return {"heatmap": heatmap, "diff": diff, "start": first, "grid_table": grid_tables(result, tab.shown, first)}
    return guard.ui(request, redraw)

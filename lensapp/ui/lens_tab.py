"""The logit-lens and Jacobian-lens tabs: one builder, configured for each.

Both show a layer x token heatmap for a prompt, the top-k table at one position and the target
curves. The Jacobian tab reads both lenses over the layers that have a J, shows them side by side
on one colour scale with a view of where their top-1 differs, and the lens's provenance. Its inputs
are the `lens` request's fields but the lens (`views.TAB_VIEWS`); the handlers below are what its
events call. Under the readout: a cell described in words (`describing.py`), "Show the code" (the view as a
short nnsight script, in the form the visitor picks: below) and, on the Jacobian tab, how good the lens is
(`evaluation.py`). The tabs' words (intros, "How to read this", the options' explanations) lead the module.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, replace
from functools import partial

import gradio as gr

from .. import charts, redact
from ..lens_kinds import BOTH, LOGIT, read_by, reads_jlens, shown
from ..service.asks import asking
from ..service.planning import jlens_subset
from ..service.selection import span
from ..snippets import model_reference
from ..snippets.lens import lens_snippet
from .components_tab import cell_link
from .decisions import build_strip, redraw_strip, strip_of
from .describing import build_describe_panel, describe
from .downloads import Downloads
from .evaluation import build_evaluation_panel
from .examples import lens_examples
from .first_view import FIRST_CHART, PHONE_LATER
from .form import Form, asked
from .kept import Kept, kept_state, recipe
from .notes import highlight_of
from .readout import colour_metric, grid_tables, lens_summary, position_choices, top_k_tables
from .tabs import Components, TabParts, build_chart, how_to, int_or, md_text, on, warn
from .views import START, TAB_VIEWS, TabView

# -- the tabs' words: intros, "How to read this", the page without a Jacobian lens, the options' help -------

# Both tabs: the column a BOS rule adds (service/prompts.py reads every prompt so when the lens was fitted so).
BOS_COLUMN = """
- A first column such as `<|im_start|>` or `<s>` is the tokenizer's start token (BOS), not your text: the
  Jacobian lens loaded was fitted with it before every prompt, so every tab reads every prompt with it first.
  The model parks attention there; its cells say little.
"""[1:]

LOGIT_HOW_TO = """
Each **row** is a layer (layer 0 at the bottom, the last layer at the top) and each **column** a prompt
token. A cell shows the token the model would predict *next* if it stopped at that layer: the layer's
residual stream sent through the model's own final norm and unembedding. The colour is the metric you
choose; hover a cell for its top-k.

- Read a column bottom to top to watch a prediction form. The top row is the model's real output.
- `␣` is a space, `↵` a newline, `⇥` a tab: tokens often start with a space.
- *Skip punctuation and whitespace* shows each cell's best word instead of a `.` or `␣`, with its rank as a
  superscript (`␣city³`: rank 3); the hover still lists the true top-k, and the colour is still the metric's.
- Early layers of most models read out noise or the current token itself; that is expected.
- *KL to final* is how far a layer's guess is from the model's final distribution (0 = the same).
- *Target* metrics score the first token of each target word as it would follow the prompt (a leading
  space is added).
""" + BOS_COLUMN

JACOBIAN_HOW_TO = """
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
""" + BOS_COLUMN

NO_LENS = """
### No Jacobian lens is loaded

This tab compares the logit lens with a **Jacobian lens**, a set of pre-fitted matrices that belongs to
one model. None was configured when the app started, so there is nothing to show here.

To load one, restart the app with `--jlens`:

- a lens file for this model: `lensapp serve --jlens path/to/lens.pt`
  (make one with `lensapp fit ...`; the embedded model's ships with the app);
- a published lens on the Hugging Face hub, with `--model Qwen/Qwen3-8B`:
  `--jlens neuronpedia/jacobian-lens:qwen3-8b/jlens/Salesforce-wikitext/Qwen3-8B_jacobian_lens.pt`.

The same setting can come from the environment: `LENSAPP_JLENS=...`.
"""

# Above the chart: what the picture is, in two plain sentences ("How to read this" says the rest).
LOGIT_INTRO = ("The picture below reads a prompt layer by layer: each row is a layer of the model (the first at "
               "the bottom) and each column a word piece of the prompt. A cell is the word the model would say "
               "next if it stopped at that layer, so a column read upward shows the answer forming: for *The "
               "capital of France is*, ␣Paris takes over in the top layers.")
JACOBIAN_INTRO = ("The same picture through the Jacobian lens, beside the plain logit lens: each layer is first "
                  "carried to the last layer by a fitted average Jacobian, so a cell is what that layer is "
                  "disposed to say. The view under it marks the cells where the two lenses disagree.")
RAW_INFO = ("Unembed with h·W_U alone, skipping the model's own logit soft-capping or scaling (the same as the "
            "default for models that have none).")
SUBLAYERS_INFO = ("Rows L.attn (after the layer's attention) between rows L.mlp (after its MLP): which half of a "
                  "layer wrote a prediction.")


@dataclass(frozen=True)
class LensTab:
    view: TabView           # what its link carries (its name: the permalink's tab id and elem-id prefix)
    title: str
    intro: str
    how_to: str
    lens: str               # what the request reads (a `lens` field value: lens_kinds.readings)
    run_label: str

    @property
    def name(self) -> str:
        return self.view.name

    @property
    def shown(self) -> tuple[str, ...]:
        """The lenses its charts and tables show, in their order."""
        return shown(self.lens)

    @property
    def through_j(self) -> bool:
        """Whether it reads a lens through the Jacobian stack: it then has the J-lens's parts (its provenance,
        its evaluation, the two lenses side by side) and only the stack's layers."""
        return reads_jlens(read_by(self.lens))


LOGIT_TAB = LensTab(TAB_VIEWS["logit"], "Logit lens", LOGIT_INTRO, LOGIT_HOW_TO, LOGIT.name, "Run logit lens")
JACOBIAN_TAB = LensTab(TAB_VIEWS["jacobian"], "Jacobian lens", JACOBIAN_INTRO, JACOBIAN_HOW_TO, BOTH,
                       "Run both lenses")
LENS_TABS = {tab.name: tab for tab in (LOGIT_TAB, JACOBIAN_TAB)}


def lens_request(tab: LensTab, service, values: dict):
    """The request `tab` sends for its inputs' `values` (by name), read by the fields' parsers, and the
    asked-for layers left out for having no J (the page and a link's prefetch, `ui.prefetch`, send the same)."""
    req = asked(tab.view, service, values, lens=tab.lens)
    if not tab.through_j:
        return req, []
    have, missing = jlens_subset(req.layers, service.info.n_layers, service.jlens_layers)
    return replace(req, layers=",".join(map(str, have))), missing


def build_lens_tab(tab: LensTab, service, guard, downloads: Downloads, note: gr.Textbox | None = None) -> TabParts:
    """note: the link's note box (its references outline cells), when the page has one."""
    with gr.Tab(tab.title, id=tab.name):
        if tab.through_j and service.jlens is None:
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
        if tab.through_j:                       # how good is each lens: the shipped items, computed once
            build_evaluation_panel(tab.name, service, guard)
    reads = {"note": note} if note is not None else {}
    parts = {**form.inputs, **outputs, **more, **reads}
    run_fn = partial(run, tab, service, guard)
    # A long prompt's first look is its drawn window (`readout`); the rest follows, without a veil over the picture,
    # and a new Run cancels it (else the old prompt's whole readout could land over the new one's first look). Its
    # trigger is the first look's own mark, not the state it writes: Gradio's JSON sends a change again after an
    # event that its change started answers it, and a heavy link's page sent complete and show_code every ~0.6 s.
    completing = on(parts["unread"].change, partial(complete, tab, service, guard), parts,
                    ["unread", *form.inputs, *reads], [name for name in outputs if name != "unread"],
                    show_progress="hidden")
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
    for warning in (service.jlens.warnings if tab.through_j else []):
        gr.Markdown(f"**Note:** {md_text(redact.paths(warning))}.", elem_classes=["lens-warning"])
    how_to(tab.how_to)


def _inputs(tab: LensTab, form: Form, service) -> None:
    layers = (f"Layers (all, a range like 20-29 or a list; these have a J: {span(service.jlens_layers)})"
              if tab.through_j else f"Layers (all, 10-20 or 0,5,-1; this model: 0..{service.info.n_layers - 1})")
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
                          visible=tab.through_j)
    out["position"] = gr.Dropdown(label="Token table: position", choices=[], interactive=True,
                                  elem_id=f"{tab.name}-position")
    out["table"] = gr.Dataframe(label="Top-k at this position, every layer (p = probability)", interactive=False,
                                wrap=True, elem_id=f"{tab.name}-table")
    out["curves"] = gr.Plot(visible=False, elem_classes=["lens-plot"], show_label=False, elem_id=f"{tab.name}-curves")
    out["state"] = kept_state()
    # A first look's mark, new for each: its change reads the rest (`complete`); hidden, not unrendered (an
    # unrendered component sends no change).
    out["unread"] = gr.Textbox(visible="hidden", show_label=False, elem_classes=["unread"])
    out.update(downloads.buttons(f"{tab.name}-lens", out["state"]))
    return out


def _more(tab: LensTab, service) -> Components:
    """A cell described in words, the code and the lens's provenance under the readout."""
    described = build_describe_panel(tab.name, service.info.n_layers)
    code = build_code_panel(tab.name)
    if tab.through_j:
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
        **({} if whole else {"unread": first_look_mark(req)}),
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
    """After a first look (its mark `unread`, `first_look_mark`, calls this), the whole readout of the same
    request, not counted twice in a workshop's usage; nothing when the prompt was edited since (its Run reads it).
    It reads the mark, not the state: a change event sends the page's values as they are when it fires, and the
    state written in the same answer as the mark was now and then not there yet."""
    looked_at = _looked_at(values["unread"])
    if looked_at is None:
        return {}

    def whole():
        if lens_request(tab, service, values)[0].prompts[0] != looked_at:
            return {}
        with asking(counted=False):
            return readout(tab, service, values, first_look=False)
    return guard.ui(request, whole)


def first_look_mark(req) -> str:
    """The mark a first look of `req` leaves for `complete`: what it read, and new for each first look (a change
    of the same text sends no event)."""
    return json.dumps({"prompt": req.prompts[0], "look": uuid.uuid4().hex})


def _looked_at(mark) -> str | None:
    """The prompt a first look's mark names (None: no mark, or not one: a page sends what it is sent)."""
    try:
        prompt = json.loads(mark).get("prompt") if mark else None
    except (ValueError, TypeError, AttributeError):
        return None
    return prompt if isinstance(prompt, str) else None


def first_heatmap(tab: LensTab, service, values: dict, result):
    """The heatmap `readout` draws first from `result` for `values` (a link's): the picture a link's page draws
    before it has started (`first_view.py`)."""
    req, _ = lens_request(tab, service, values)
    metric = colour_metric(values.get("metric"), req.targets, quiet=True)
    cols = charts.window_of(len(result.input_ids), START(values.get("start")), charts.DisplaySettings())
    return draw(tab, result, metric, cols.start, values.get("note"), values.get("chat"))[0]


def draw(tab: LensTab, result, metric: str, first, note=None, chat=False) -> tuple:
    """The heatmap(s) of `result` from position `first` (None: the last ones); the cells the link's note
    names outlined; a click on a logit-lens cell opens its components ("who wrote this?")."""
    highlight = highlight_of(note, result.layers)
    if tab.through_j:
        return (build_chart(charts.lens_pair, result, metric, start=first, highlight=highlight),
                build_chart(charts.lens_diff, result, start=first))
    href = cell_link(result.prompt, bool(chat))
    if result.after_attention is not None:
        return build_chart(charts.sublayer_heatmap, result, metric, start=first, href=href), gr.skip()
    return (build_chart(charts.lens_heatmap, result, tab.lens, metric, start=first, highlight=highlight, href=href),
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


# -- "Show the code": its panel, and the script from the result in hand (snippets/lens.py) ------------------

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
    """The view of `result` as a runnable nnsight script (snippets/lens.py), in the form picked: `lens_snippet`
    writes vLLM's for "vllm" and TransformersModel's for any other value, so a form sent by hand reads as the
    default (which form is which is a published link value, named there only: tests/test_layout.py)."""
    source = service.jlens.describe()["source"] if service.jlens is not None else None
    if reads_jlens(read_by(lens)) and not source:        # a lens made in this process (a test's, a fit's) has none
        return ("# No script for this lens here: this app's Jacobian lens was made in memory, not loaded from a "
                "file,\n# and a script loads its lens from one (lensapp serve --jlens PATH serves a saved lens).\n")
    model, note = model_reference(service.cfg.engine.model, service.info.name)
    return lens_snippet(family=service.model.family, model=model, prompt=result.prompt,
                        layers=result.layers, k=result.lenses[next(iter(result.lenses))].top_ids.shape[-1], lens=lens,
                        jlens=source, chat=chat, form=form, model_note=note, bos=service.prompts.bos)

"""The logit-lens and Jacobian-lens tabs: one builder, configured for each.

Both show a layer x token heatmap for a prompt, the top-k table at one position and the target
curves. The Jacobian tab reads both lenses over the layers that have a J, shows them side by side
on one colour scale with a view of where their top-1 differs, and the lens's provenance.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import gradio as gr
import numpy as np
import pandas as pd

from .. import charts, redact
from ..config import MAX_K, PUNCTUATION_WIDTH
from ..service import LensRequest
from ..service import fields as f
from ..service.planning import jlens_subset
from ..service.selection import span
from ..snippets import lens_snippet, model_reference
from .decisions import build_strip, draw_strip
from .describing import build_describe_panel, describe_cell
from .downloads import Downloads
from .examples import lens_examples
from .notes import highlight_of
from .permalinks import METRIC, START, View, as_text, view_of
from .tabs import PRIVATE, TabParts, build_chart, int_or, md_text, table_html, warn

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
"""

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
"""

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


@dataclass(frozen=True)
class LensTab:
    name: str               # permalink tab id and elem-id prefix
    title: str
    intro: str
    how_to: str
    lens: str               # what the request reads: "logit" or "both"
    run_label: str


# Above the chart: what the picture is, in two plain sentences ("How to read this" says the rest).
LOGIT_INTRO = ("The picture below reads a prompt layer by layer: each row is a layer of the model (the first at "
               "the bottom) and each column a word piece of the prompt. A cell is the word the model would say "
               "next if it stopped at that layer, so a column read upward shows the answer forming: for *The "
               "capital of France is*, ␣Paris takes over in the top layers.")
JACOBIAN_INTRO = ("The same picture through the Jacobian lens, beside the plain logit lens: each layer is first "
                  "carried to the last layer by a fitted average Jacobian, so a cell is what that layer is "
                  "disposed to say. The view under it marks the cells where the two lenses disagree.")
LOGIT_TAB = LensTab("logit", "Logit lens", LOGIT_INTRO, LOGIT_HOW_TO, "logit", "Run logit lens")
JACOBIAN_TAB = LensTab("jacobian", "Jacobian lens", JACOBIAN_INTRO, JACOBIAN_HOW_TO, "both", "Run both lenses")


def lens_request(tab: LensTab, service, prompt, layers, k, targets, chat, raw,
                 punct=False) -> tuple[LensRequest, list[int]]:
    """The request `tab` sends for these inputs, read by the fields' parsers, and the asked-for layers left
    out for having no J (the page and a link's prefetch, `ui.prefetch`, must send the same one)."""
    req = LensRequest.parse(prompts=[prompt], lens=tab.lens, layers=layers, k=k, targets=targets, chat=chat, raw=raw,
                            skip_punctuation=punct)
    if tab.lens == "logit":
        return req, []
    have, missing = jlens_subset(req.layers, service.info.n_layers, service.jlens_layers)
    return replace(req, layers=",".join(map(str, have))), missing


def build_lens_tab(tab: LensTab, service, guard, downloads: Downloads, note: gr.Textbox | None = None) -> TabParts:
    """note: the link's note box (its references outline cells), when the page has one."""
    d = View()
    info = service.info
    jacobian = tab.lens != "logit"
    with gr.Tab(tab.title, id=tab.name):
        if jacobian and service.jlens is None:
            gr.Markdown(NO_LENS + (f"\n\nThe lens could not be loaded: {md_text(redact.paths(service.jlens_error))}"
                                   if service.jlens_error else ""), elem_id="jlens-missing")
            return TabParts(tab.name, {}, lambda: View(tab=tab.name))
        gr.Markdown(tab.intro, elem_id=f"{tab.name}-intro")
        for warning in (service.jlens.warnings if jacobian else []):
            gr.Markdown(f"**Note:** {md_text(redact.paths(warning))}.", elem_classes=["lens-warning"])
        with gr.Accordion("How to read this", open=False):
            gr.Markdown(tab.how_to)
        layers_label = (f"Layers (all, a range like 20-29 or a list; these have a J: {span(service.jlens_layers)})"
                        if jacobian else f"Layers (all, 10-20 or 0,5,-1; this model: 0..{info.n_layers - 1})")
        with gr.Row():
            prompt = gr.Textbox(label="Prompt", value=d.prompt, lines=2, max_lines=8, scale=3,
                                elem_id=f"{tab.name}-prompt")
            targets = gr.Textbox(label="Target word(s), comma-separated (optional)", value=as_text(d.targets),
                                 scale=2, elem_id=f"{tab.name}-targets")
        with gr.Row():
            layers = gr.Textbox(label=layers_label, value=d.layers, elem_id=f"{tab.name}-layers")
            k = gr.Number(label="Top-k", value=d.k, minimum=1, maximum=MAX_K, precision=0, elem_id=f"{tab.name}-k")
            metric = gr.Dropdown(label="Colour cells by", value=d.metric, elem_id=f"{tab.name}-metric",
                                 choices=[(m.title, key) for key, m in charts.METRICS.items()])
            chat = gr.Checkbox(label="Wrap in the chat template (instruct models)", value=d.chat)
            punct = punctuation_box(d.punct, f"{tab.name}-punct")
        with gr.Accordion("Advanced", open=False):
            raw = gr.Checkbox(label="Raw logits", value=d.raw, elem_id=f"{tab.name}-raw",
                              info="Unembed with h·W_U alone, skipping the model's own logit soft-capping or "
                                   "scaling (the same as the default for models that have none).")
        start = gr.Number(value=None, visible=False, elem_id=f"{tab.name}-start")   # the link's window, if any
        run_button = gr.Button(tab.run_label, variant="primary", elem_id=f"{tab.name}-run", elem_classes=["run"])
        examples = lens_examples(prompt, targets)
        summary = gr.Markdown(elem_id=f"{tab.name}-summary")
        window = gr.Slider(0, 1, value=0, step=1, visible=False, label="Positions shown: the first of the window",
                           elem_id=f"{tab.name}-window")
        heatmap = gr.Plot(elem_id=f"{tab.name}-heatmap", elem_classes=["lens-plot"], show_label=False)
        strip = build_strip(tab.name)
        with gr.Accordion("Heatmap as a table", open=False, elem_id=f"{tab.name}-grid-box"):
            grid_table = gr.HTML(elem_id=f"{tab.name}-grid-table", elem_classes=["grid-table"])
        diff = gr.Plot(elem_id=f"{tab.name}-diff", elem_classes=["lens-plot"], show_label=False, visible=jacobian)
        position = gr.Dropdown(label="Token table: position", choices=[], interactive=True,
                               elem_id=f"{tab.name}-position")
        table = gr.Dataframe(label="Top-k at this position, every layer (p = probability)", interactive=False,
                             wrap=True, elem_id=f"{tab.name}-table")
        curves = gr.Plot(visible=False, elem_classes=["lens-plot"], show_label=False, elem_id=f"{tab.name}-curves")
        describe = build_describe_panel(tab.name, info.n_layers)
        state = gr.State()
        csv_file, json_file = downloads.buttons(f"{tab.name}-lens", state)
        with gr.Accordion("Show the code", open=False, elem_id=f"{tab.name}-code-box"):
            gr.Markdown("This view as a short nnsight script: paste it into a notebook (the copy button is at "
                        "the top right) to get the same numbers.")
            form = gr.Radio([("TransformersModel (runs anywhere)", "transformers"),
                             ("vLLM (the app's engine)", "vllm")], value="transformers", show_label=False)
            code = gr.Code(language="python", interactive=False, elem_id=f"{tab.name}-code")
        if jacobian:
            with gr.Accordion("Lens provenance", open=False):
                gr.JSON(value=service.jlens.describe(), label="The lens file", elem_id="jlens-provenance")
    shown = ("jacobian", "logit") if jacobian else ("logit",)

    def draw(result, metric, first, note=None):
        """The heatmap(s) of `result` from position `first` (None: the last ones); the cells the link's
        note names outlined."""
        highlight = highlight_of(note, result.layers)
        if jacobian:
            return (build_chart(charts.lens_pair, result, metric, start=first, highlight=highlight),
                    build_chart(charts.lens_diff, result, start=first))
        return build_chart(charts.lens_heatmap, result, "logit", metric, start=first, highlight=highlight), gr.skip()

    def readout(prompt, layers, k, targets, metric, chat, raw, start, punct=False, note=None):
        req, missing = lens_request(tab, service, prompt, layers, k, targets, chat, raw, punct)
        metric = colour_metric(metric, req.targets)
        if missing:
            warn(f"Layers {', '.join(map(str, missing))} have no Jacobian lens; showing the others.")
        result = service.lens(req)[0]
        for warning in (result.jlens or {}).get("warnings", []):    # read unlike the lens was fitted (BOS)
            if warning not in getattr(service.jlens, "warnings", []):   # those are noted above the tab already
                warn(f"Jacobian lens: {warning}.")
        last = len(result.input_ids) - 1
        cols = charts.window_of(len(result.input_ids), START(start), charts.DisplaySettings())
        pair, diff_chart = draw(result, metric, cols.start, note)
        return (
            result,
            pair,
            diff_chart,
            gr.Slider(minimum=0, maximum=max(1, len(result.input_ids) - len(cols)), value=cols.start,
                      visible=len(cols) < len(result.input_ids)),
            lens_summary(result, shown),
            gr.Dropdown(choices=position_choices(result.input_tokens), value=last),
            top_k_tables(result, shown, last),
            gr.Plot(value=line_charts(result, shown, last), visible=True),
            gr.Button(visible=True),                 # the downloads: built from `result` when asked for
            gr.Button(visible=True),
            grid_tables(result, shown, cols.start),
            gr.Radio(value="top1"),
            *draw_strip(result, "top1", cols.start),
        )

    def run(prompt, layers, k, targets, metric, chat, raw, start, punct=False, note=None, request: gr.Request = None):
        return guard.ui(request, readout, prompt, layers, k, targets, metric, chat, raw, start, punct, note)

    outputs = [state, heatmap, diff, window, summary, position, table, curves, csv_file, json_file, grid_table,
               strip["rule"], strip["strip"], strip["summary"]]
    inputs = [prompt, layers, k, targets, metric, chat, raw, start, punct] + ([note] if note is not None else [])
    run_button.click(run, inputs, outputs, **PRIVATE)
    prompt.submit(run, inputs, outputs, **PRIVATE)
    examples.load_input_event.then(run, inputs, outputs, **PRIVATE)

    def show_position(result, pos):
        pos = int_or(pos, -1)
        if result is None or not 0 <= pos < len(result.input_ids):     # none chosen, or not one of the choices
            return gr.skip(), gr.skip()
        return top_k_tables(result, shown, pos), line_charts(result, shown, pos)

    def pick_position(result, pos, request: gr.Request = None):
        return guard.ui(request, show_position, result, pos)

    position.input(pick_position, [state, position], [table, curves], **PRIVATE)
    strip["rule"].input(draw_strip, [state, strip["rule"], window], [strip["strip"], strip["summary"]], **PRIVATE)
    window.release(draw_strip, [state, strip["rule"], window], [strip["strip"], strip["summary"]], **PRIVATE)

    def describe_at(result, pos, chat, layer, max_tokens, inspect, inspect_layer, request: gr.Request = None):
        return guard.ui(request, describe_cell, service, result, pos, chat, layer, max_tokens, inspect, inspect_layer,
                        False)

    def describe_column(result, pos, chat, layer, max_tokens, inspect, inspect_layer, request: gr.Request = None):
        return guard.ui(request, describe_cell, service, result, pos, chat, layer, max_tokens, inspect, inspect_layer,
                        True)

    asked = [state, position, chat] + [describe[name] for name in ("layer", "max_tokens", "inspect", "inspect_layer")]
    describe["one"].click(describe_at, asked, describe["table"], **PRIVATE)
    describe["column"].click(describe_column, asked, describe["table"], **PRIVATE)

    def move_window(result, metric, first, note=None):
        """Redraw from the result in hand (no new readout); the link remembers the window."""
        if result is None:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip()
        metric = colour_metric(metric, result.lenses[shown[0]].targets, quiet=True)
        first = int_or(first, 0)
        return (*draw(result, metric, first, note), first, grid_tables(result, shown, first))

    def slide(result, metric, first, note=None, request: gr.Request = None):
        return guard.ui(request, move_window, result, metric, first, note)

    window.release(slide, [state, metric, window] + inputs[9:], [heatmap, diff, start, grid_table], **PRIVATE)

    def show_code(result, form, chat):
        if result is None:
            return gr.skip()
        return code_for(service, result, tab.lens, form, bool(chat))

    state.change(show_code, [state, form, chat], code, **PRIVATE)
    form.change(show_code, [state, form, chat], code, **PRIVATE)

    fields = {"prompt": prompt, "layers": layers, "k": k, "targets": targets, "metric": metric, "chat": chat,
              "raw": raw, "start": start, "punct": punct}
    return TabParts(tab.name, fields, lambda *values: view_of(tab.name, **dict(zip(fields, values))), run, inputs,
                    outputs, run_button, handlers={"show_position": pick_position, "move_window": slide,
                                               "describe_at": describe_at, "describe_column": describe_column})


def line_charts(result, lenses: tuple[str, ...], position: int):
    """The targets' curves; with no target, the tokens that were top-1 at some layer at `position`."""
    if result.lenses[lenses[0]].targets:
        return build_chart(charts.target_curves, result, lenses)
    return build_chart(charts.top1_curves, result, lenses, position)


def punctuation_box(value: bool, elem_id: str) -> gr.Checkbox:
    return gr.Checkbox(label="Skip punctuation and whitespace", value=value, elem_id=elem_id,
                       info=f"Each cell shows the best word among the top {PUNCTUATION_WIDTH} (² = its rank); "
                            "hover still shows the true top-k.")


def grid_tables(result, lenses: tuple[str, ...], start: int | None = None) -> str:
    """Each heatmap as an HTML table a screen reader reads (a row per layer, a column per position drawn)."""
    return "".join(table_html(charts.lens_table(result, lens, start=start), f"{charts.LENS_TITLES[lens]}: the "
                              "token each cell shows, per layer (rows, the top layer first) and position (columns)")
                   for lens in lenses)


def colour_metric(metric, targets, quiet: bool = False) -> str:
    """The metric to colour by: the asked-for one, or top-1 probability where it cannot be drawn (an unknown
    name, or a target metric with no target), with a warning unless `quiet`."""
    try:
        metric = METRIC(metric)
    except f.RequestError:
        return METRIC.default
    if charts.METRICS[metric].needs_target and not targets:
        if not quiet:
            warn("That colour needs a target word; showing top-1 probability instead.")
        return METRIC.default
    return metric


def code_for(service, result, lens: str, form: str, chat: bool = False) -> str:
    """The view of `result` as a runnable nnsight script (snippets.py)."""
    model, note = model_reference(service.cfg.model, service.info.name)
    return lens_snippet(family=service.model.family, model=model, prompt=result.prompt,
                        layers=result.layers, k=result.lenses[next(iter(result.lenses))].top_ids.shape[-1], lens=lens,
                        jlens=service.jlens.describe()["source"] if service.jlens is not None else None,
                        chat=chat, form="vllm" if form == "vllm" else "transformers", model_note=note)


def top_k_tables(result, lenses: tuple[str, ...], position: int) -> pd.DataFrame:
    """The top-k table at one position, a row per layer (and lens, when there are two)."""
    if len(lenses) == 1:
        return charts.display_tokens(result.top_k_table(lenses[0], position))
    frames = [result.top_k_table(lens, position).assign(lens=charts.LENS_TITLES[lens]) for lens in lenses]
    df = pd.concat(frames, ignore_index=True)
    return charts.display_tokens(df[["lens"] + [c for c in df.columns if c != "lens"]])


def position_choices(tokens: list[str]) -> list[tuple[str, int]]:
    return [(f"{i}: {charts.clip(charts.show_token(t), 24)}", i) for i, t in enumerate(tokens)]


def lens_summary(result, lenses: tuple[str, ...]) -> str:
    """A few lines of Markdown: the model's next token and each target's score at the deepest layer."""
    lines = [f"**The model's next token:** {md_text(charts.show_token(result.model_next_token))}  ·  "
             f"{len(result.input_ids)} prompt tokens × {len(result.layers)} layers"]
    last = result.layers[-1]
    for lens in lenses:
        for t in result.lenses[lens].targets:
            p, rank = float(t.probs[-1, -1]), int(t.ranks[-1, -1])
            line = (f"{charts.LENS_TITLES[lens]}, layer {last}: P({md_text(charts.show_token(t.tokens[0]))}) = "
                    f"{100 * p:.1f}% (rank {rank})")
            if len(t.token_ids) > 1:
                whole = float(np.exp(t.continuation_logprob[-1])) if t.continuation_logprob is not None else None
                line += (f"; {md_text(t.text)} is {len(t.token_ids)} tokens, scored by its first"
                         + (f"; the whole word: {100 * whole:.2f}%" if whole is not None else ""))
            lines.append("- " + line)
    return "\n".join(lines)

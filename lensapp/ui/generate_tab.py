"""The generation tab: a readout of the newest token at every step, and the chat (chat_tab.py).

Its inputs are the `generate` request's fields but `force` (`views.TAB_VIEWS`: the tab's own generation is
unforced; its branches, ui/branching.py, force tokens, and its link carries them as `branches`); the handlers
below are what its events call."""

from __future__ import annotations

import time
from dataclasses import replace
from functools import partial
from typing import Iterator

import gradio as gr
import pandas as pd

from .. import charts, lens_kinds
from ..lens_kinds import LOGIT
from ..service.generating import Partial
from ..service.kinds import KINDS
from . import branching
from .chat_tab import build_chat
from .decisions import build_strip, redraw_strip, strip_of
from .downloads import Downloads
from .examples import generate_examples
from .first_view import FIRST_CHART, PHONE_LATER
from .form import Form, asked, single_lenses
from .kept import Kept, kept_state, recipe
from .tabs import PRIVATE, Components, Pace, TabParts, build_chart, how_to, int_or, new_seed, on
from .views import TAB_VIEWS, TabView

HOW_TO = """
The model writes one token per **step**. Each **column** is a step, labelled by the token the model
produced there; each **row** a layer (0 at the bottom). A cell is the lens's top-1 at the newest position
of that step, the position whose output *is* that column's token. So a cell equal to its column label
means that layer already said what the model went on to say; the top row always does under greedy
decoding (temperature 0).

Step 0 reads the last prompt token. Pick a step below for its top-k at every layer. With a temperature
above 0, the seed makes the sample reproducible: left empty, a run picks one and shows it.
"""


def build_generate_tab(service, guard, downloads: Downloads, view: TabView = TAB_VIEWS["generate"]) -> TabParts:
    """view: what the tab shows and its link carries (a test builds it for a throwaway kind)."""
    with gr.Tab("Generation", id=view.name):
        with gr.Tabs():
            with gr.Tab("Step by step", id=f"{view.name}-steps"):
                gr.Markdown("Generate, and read every layer at the newest token of every step.")
                how_to(HOW_TO)
                form = Form(view, service)
                reseed = _inputs(form, service)
                with gr.Row():
                    run_button = gr.Button("Generate", variant="primary", elem_id=f"{view.name}-run",
                                           elem_classes=["run"], scale=4)
                    stop_button = gr.Button("Stop", variant="stop", elem_id=f"{view.name}-stop", scale=1,
                                            min_width=80)
                with gr.Column(elem_classes=[PHONE_LATER]):
                    examples = generate_examples(form.inputs["prompt"])
                outputs = _outputs(view, service, downloads, form.inputs["seed"])
                # a run writes the branches it drew (a tab without them: to nowhere)
                outputs["branches"] = form.inputs.get("branches") or gr.State("")
            with gr.Tab("Chat", id=f"{view.name}-chat"):
                build_chat(service, guard)
    parts = {**form.inputs, **outputs}
    run_fn = partial(run, view, service, guard)
    written = [name for name in outputs if name != "rule"]
    reseed.click(new_seed, None, form.inputs["seed"], queue=False, **PRIVATE)
    # the page's own Generate writes as the model writes; Stop ends it there, keeping what was written. Its
    # progress is the text growing and a timer: Gradio's full progress animates a spinner over every output for
    # the whole generation, which kept a headless Chromium at 45-60% of the app's two cores (bench/RESULTS.md).
    triggers = ([run_button.click, form.inputs["prompt"].submit], examples.load_input_event.then)
    runs = [on(trigger, partial(run_streamed, view, service, guard), parts, [*form.inputs, "rule"], written,
               stream=True, show_progress="minimal") for trigger in triggers]
    stop_button.click(None, None, None, cancels=runs, queue=False, **PRIVATE)
    on([parts["step"].input, parts["table_lens"].input], partial(pick_step, guard), parts,
       ["state", "step", "table_lens"], ["table"])
    on(parts["rule"].input, partial(redraw_strip, guard), parts, ["state", "rule"], ["strip", "decided"])
    _wire_branches(service, guard, parts)
    return TabParts(view, form.inputs, outputs, run_fn, {"rule": parts["rule"]}, run_button)


def _wire_branches(service, guard, parts: Components) -> None:
    """The branch panel's events (ui/branching.py): a token clicked shows its alternatives; one picked (or typed)
    grows a branch; another branch chosen is shown beside the generation."""
    panel = ["state", "branch_results", "branch_source"]
    on(parts["branch_source"].input, partial(branching.pick_source, guard), parts, panel,
       ["branch_step", "branch_alternatives"])
    on([parts["branch_step"].input, parts["branch_layer"].input], partial(branching.pick_step, guard), parts,
       [*panel, "branch_step", "branch_layer"], ["branch_alternatives"])
    grown = [*panel, "req", "branch_step", "rule"]
    on(parts["branch_alternatives"].input, partial(branching.grow, service, guard, "branch_alternatives"), parts,
       [*grown, "branch_alternatives"], branching.UPDATED)
    on([parts["branch_force"].click, parts["branch_word"].submit],
       partial(branching.grow, service, guard, "branch_word"), parts, [*grown, "branch_word"], branching.UPDATED)
    on(parts["branch_shown"].input, partial(branching.show, guard), parts,
       ["state", "branch_results", "branch_shown", "rule"], branching.SHOWN)


def _inputs(form: Form, service) -> gr.Button:
    """The form, laid out; its New seed button."""
    form.add("prompt", lines=2, max_lines=8)
    with gr.Row(elem_classes=[PHONE_LATER]):             # on a phone, after the picture (first_view.py)
        form.add("max_tokens")
        form.add("temperature")
        form.add("lens")
    with gr.Row(elem_classes=[PHONE_LATER]):
        form.add("layers", label=f"Layers (all, 10-20 or 0,5,-1; this model: 0..{service.info.n_layers - 1})")
        form.add("k")
        form.add("seed")
        reseed = gr.Button("New seed", size="sm", scale=0, min_width=100, elem_id=f"{form.view.name}-new-seed")
    with gr.Row(elem_classes=[PHONE_LATER]):
        form.add("chat")
        form.add("raw")
    if "branches" in form.fields:
        form.add("branches", visible=False)      # the link's branches: the panel below writes them
    form.rest()
    return reseed


def _outputs(view: TabView, service, downloads: Downloads, seed: gr.Number) -> Components:
    """What a generation writes, by name (the seed a sample used among them)."""
    out = {"seed": seed, "text": gr.Textbox(label="Generated text", interactive=False, elem_id=f"{view.name}-text"),
           "heatmap": gr.Plot(elem_id=f"{view.name}-heatmap", elem_classes=["lens-plot", FIRST_CHART],
                              show_label=False)}
    out.update(build_strip(view.name))
    lenses = single_lenses(service)
    with gr.Row():
        out["step"] = gr.Dropdown(label="Token table: step", choices=[], interactive=True, elem_id=f"{view.name}-step")
        out["table_lens"] = gr.Radio(lenses, value=LOGIT.name, label="Table lens", visible=len(lenses) > 1)
    out["table"] = gr.Dataframe(label="Top-k at this step's newest token, every layer", interactive=False,
                                wrap=True, elem_id=f"{view.name}-table")
    out["state"] = kept_state()
    out.update(downloads.buttons("generation", out["state"]))
    out.update(branching.build_branch_panel(service.info.n_layers))
    return out


def run(view: TabView, service, guard, values: dict, request: gr.Request = None) -> dict:
    """The generation the inputs' `values` (by name) ask, with the branches a link names, through the guard."""
    return guard.ui(request, readout, view, service, values)


def run_fresh(view: TabView, service, guard, values: dict, request: gr.Request = None) -> dict:
    """The page's own Generate: a new generation starts with no branches."""
    return run(view, service, guard, {**values, "branches": ""}, request=request)


def run_streamed(view: TabView, service, guard, values: dict, request: gr.Request = None) -> Iterator[dict]:
    """The page's own Generate (no branches), written as the model writes: the text, the heatmap's columns, the strip
    and the step table as they come, redrawn as `Pace` affords; the whole page at the end."""
    return guard.ui_stream(request, growing, view, service, {**values, "branches": ""})


def growing(view: TabView, service, values: dict) -> Iterator[dict]:
    req = asked_generation(view, service, values)
    pace = Pace(text_first=True)
    for item in KINDS[view.kind].stream(service, req):
        if not isinstance(item, Partial):
            yield drawn(view, service, values, req, item)
        elif pace.charts_due():
            started = time.monotonic()
            page = drawn_so_far(req, item.so_far(), values)
            yield page
            pace.drawn(started, len(getattr(page["heatmap"], "plot", "")))
        elif pace.text_due():                   # between the charts' redraws, the text alone (it costs nothing)
            yield {"text": item.text}
            pace.texted()


def drawn_so_far(req, gen, values: dict) -> dict:
    """A generation still being written: what it has so far (kept as it is, a value the page can read and
    download; Stop leaves it there)."""
    shown, last, rule = lens_kinds.shown(req.lens)[0], len(gen.steps) - 1, values.get("rule") or "top1"
    return {"state": gen, "seed": req.seed, "text": gen.text, "heatmap": picture(req, values, gen),
            "step": gr.Dropdown(choices=step_choices(gen), value=last), "table_lens": gr.Radio(value=shown),
            "table": step_table(gen, last, shown), **strip_of(gen, rule), **branching.panel_updates(gen, [], rule=rule)}


def picture(req, values: dict, gen):
    """The tab's first chart (every step's readout) for generation `gen` of `req`: `drawn`'s, a generation being
    written's, and a link's first view's (`first_view.py`)."""
    return build_chart(charts.generation_heatmap, gen, req.lens)


def asked_generation(view: TabView, service, values: dict):
    """The request the inputs ask, a sample given a seed so that it can be had again."""
    req = asked(view, service, values)
    return replace(req, seed=new_seed()) if req.seed is None and req.sampled else req


def readout(view: TabView, service, values: dict) -> dict:
    req = asked_generation(view, service, values)
    return drawn(view, service, values, req, KINDS[view.kind].run(service, req))


def drawn(view: TabView, service, values: dict, req, gen) -> dict:
    """The whole page for generation `gen` of `req` (and the branches a link names)."""
    results = branching.compute_branches(service, req, values.get("branches"))
    shown = lens_kinds.shown(req.lens)[0]
    last = len(gen.steps) - 1
    rule = values.get("rule") or "top1"
    return {
        "state": Kept(gen, recipe(view.kind, req)), "seed": req.seed, "text": gen.text,
        "heatmap": picture(req, values, gen),
        "step": gr.Dropdown(choices=step_choices(gen), value=last),
        "table_lens": gr.Radio(value=shown),
        "table": step_table(gen, last, shown),
        **Downloads.shown(),
        "req": Kept(req, recipe(view.kind, req, "request")), **strip_of(gen, rule),
        **branching.panel_updates(gen, results, rule=rule, req=req),
    }


def pick_step(guard, values: dict, request: gr.Request = None) -> dict:
    """The top-k table of the chosen step (none chosen, or not one of the choices: unchanged)."""
    def table():
        gen, s = values["state"], int_or(values["step"], -1)
        if gen is None or not 0 <= s < len(gen.steps):
            return {}
        return {"table": step_table(gen, s, values["table_lens"])}
    return guard.ui(request, table)


def step_choices(gen) -> list[tuple[str, int]]:
    return [(f"step {s}: {charts.clip(charts.show_token(st.token), 20)}", s) for s, st in enumerate(gen.steps)]


def step_table(gen, s: int, lens: str) -> pd.DataFrame:
    readout = gen.steps[s].readout
    if not isinstance(lens, str) or lens not in readout.lenses:
        lens = next(iter(readout.lenses))
    return charts.display_tokens(readout.top_k_table(lens, -1))

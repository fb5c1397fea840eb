"""A page's first events: the link it was opened with restored, and at the same time the readout that link names
(without a link: the example of the tab the page lands on, then the other tabs' examples in turn).

The restore and the first readout are two load events the page sends at once, not a chain: each step of a chain
was a round trip from the browser after it had applied the step before, and a short link's chart waited behind
six of them (bench/link_speed.py measures it; bench/RESULTS.md says what moved). Not one generator either: Gradio
sends a generator's last answer whole once more when it ends, and the page applied every output twice (the chart
drawn again, each state's change events sent twice). The readout is the one the link's GET already started
(`prefetch.py`): the same request, joined in the result cache.
"""

from __future__ import annotations

from typing import Callable

import gradio as gr

from ..service.asks import asking
from . import kept
from .first_view import FIRST_CHART
from .front import FRONT
from .tabs import PRIVATE, TabParts


def load_page(demo: gr.Blocks, query: gr.Textbox, restore: Callable, restored: list, pending: gr.State,
              runnable: list[TabParts], service, js: str) -> None:
    """Wire the page's load: `restore(opened_with)` (the link as `js` reads it into `query`; updates of
    `restored`, `pending` naming the tab it asks to read: a link's, or `FRONT`), the readout it asks beside
    it, and then, for the front page, `runnable`'s other examples in their order (the first is the landing tab)."""
    # No loading veil over the page while a link is restored (it covered the tabs for seconds on a busy host).
    demo.load(restore, query, restored, js=js, show_progress="hidden", **PRIVATE)
    if not runnable:
        return
    later = gr.State(None)                     # the first readout's other outputs, until the next step sends them

    def landing_readout(opened_with: str | None, request: gr.Request = None) -> dict:
        return first_readout(restore, pending, later, runnable, service, opened_with, request)

    def landing_rest(held: dict | None) -> dict:
        return {**(held or {}), later: None}

    def landing_examples(asked: str, request: gr.Request = None) -> dict:
        return {drawn: other_examples(runnable[1:], service, asked, request)}

    def landing_shown(values: dict, request: gr.Request = None) -> dict:
        out = shown_examples(runnable[1:], values.pop(drawn) or {}, values, request)
        return {drawn: None, **{c: out.get(c, gr.skip()) for c in examples}}      # Gradio reads {} as one value

    outputs = list(dict.fromkeys(c for p in runnable for c in p.outputs.values()))
    first = demo.load(landing_readout, query, [pending, later, *outputs], js=js, show_progress="hidden", **PRIVATE)
    rest = first.then(landing_rest, later, [later, *outputs], show_progress="hidden", **PRIVATE)
    # The other examples are made, then shown in a step of their own that reads the tabs' kept states as the page
    # has them then: a tab the visitor ran meanwhile keeps what it showed (the examples' one step took seconds,
    # and its answer wrote a tab's example over the generation its visitor had just asked for).
    drawn = gr.State(None)                      # the other examples made, by tab, until the next step shows them
    examples = list(dict.fromkeys(c for p in runnable[1:] for c in p.outputs.values()))
    states = {c for p in runnable[1:] for c in p.outputs.values() if kept.is_kept(c)}
    made = rest.then(landing_examples, pending, drawn, show_progress="hidden", **PRIVATE)
    made.then(landing_shown, {drawn, *states}, [drawn, *examples], show_progress="hidden", **PRIVATE)


# What a readout's first answer carries: the tab's first chart (`FIRST_CHART`) and the lines above it. Its other
# outputs (tables, other charts, the kept state, whose change starts the tab's next events) follow in the next
# step: sent together, the page drew them all before the chart (0.7 s after the answer against the bare page's
# 0.26 s).
ABOVE_THE_CHART = ("summary", "text")


def first_outputs(p: TabParts) -> set:
    """The outputs of `p` its readout's first answer carries."""
    return {c for name, c in p.outputs.items() if name in ABOVE_THE_CHART or FIRST_CHART in (c.elem_classes or [])}


def first_readout(restore: Callable, pending: gr.State, later: gr.State, runnable: list[TabParts], service,
                  opened_with: str | None, request: gr.Request = None) -> dict:
    """The readout the link asks (the first of `runnable`, the landing tab's example, without a link): its
    first outputs, and the others held in `later`."""
    shown = restore(opened_with)               # decoded again, as the restore beside it decodes it (no engine)
    asked = shown[pending]
    p = runnable[0] if asked == FRONT else next((p for p in runnable if p.name == asked), None)
    if p is None:
        return {pending: asked}
    values = {name: shown.get(c, c.value) for name, c in {**p.inputs, **p.reads}.items()}
    out = written(p, run_pending(p, service, {"pending": asked, **values}, request), request)
    first = first_outputs(p)
    return {pending: asked, **{c: v for c, v in out.items() if c in first},
            later: {c: v for c, v in out.items() if c not in first}}


def other_examples(runnable: list[TabParts], service, asked: str, request: gr.Request = None) -> dict[str, dict]:
    """After the landing tab's, the front page's other examples, by tab name, in one step (nothing for a link); an
    example that fails is said in a line and leaves the others drawn."""
    out = {}
    for p in runnable if asked == FRONT else []:
        values = {name: c.value for name, c in {**p.inputs, **p.reads}.items()}
        try:
            out[p.name] = run_pending(p, service, {"pending": FRONT, **values}, request)
        except gr.Error as e:
            gr.Warning(f"The {p.name} tab's example: {e.message}")
    return out


def shown_examples(runnable: list[TabParts], made: dict[str, dict], states: dict, request=None) -> dict:
    """The updates that show the examples `made` (by tab name) on the tabs of `runnable` that show nothing yet:
    none of their kept states holds a value on the page (`states`: kept state -> its page value)."""
    out = {}
    for p in runnable:
        if p.name in made and not any(states.get(c) for c in p.outputs.values() if kept.is_kept(c)):
            out.update(written(p, made[p.name], request))
    return out


def written(p: TabParts, out: dict, request) -> dict:
    """A readout's updates by name as the page's updates by component (a kept state keeps its value: `kept.py`;
    a page's first readouts replace nothing)."""
    return {p.outputs[name]: kept.write(p.outputs[name], value, None, request) if kept.is_kept(p.outputs[name])
            else value for name, value in out.items()}


def run_pending(p: TabParts, service, values: dict, request: gr.Request = None) -> dict:
    """The tab's readout, when the link being restored is for this tab or the page opened without one. The
    front page's examples leave the tab's inputs as they are: an input set by a tab the visitor is not on
    would rewrite the address bar to that tab's link (a generation's seed)."""
    pending = values.pop("pending")
    if pending not in (p.name, FRONT):
        return {}
    if pending != FRONT:
        return p.run(values, request=request)
    if service.status()["state"] == "down":   # the status line says so once, not a failure per tab
        return {}
    with asking(counted=False):              # the example every visit draws: nobody's choice, not counted
        out = p.run(values, request=request)
    return {name: value for name, value in out.items() if name not in p.inputs}

"""What every tab hands to `build_ui`, how its events are wired by name, and how it shows text and charts.

A tab is built by a function returning `TabParts`: its declaration (`views.TabView`), its inputs by name
(what its link carries), its readout's outputs by name, and the readout. Every event of a tab is wired
with `on`: its handler is an ordinary function of the named components' values that returns updates by
name, so `build_ui` wires links, page load and the engine status from these names alone, no tab knows
another, and a test calls a handler as the page does.
"""

from __future__ import annotations

import html
import math
import random
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import altair as alt
import gradio as gr
from gradio.components.plot import PlotData

from . import kept
from .views import TabView, View

PRIVATE = {"api_visibility": "private"}          # UI events are not API endpoints (api.py's are)
# While the model writes (a streamed generation or chat reply), a page is redrawn at most this often, counted
# between draws: a redraw costs the web process a chart's making and the browser its drawing, so not one per token.
REDRAW_SECONDS = 0.5
# ... and its charts no more than this share of the time: a generation's pair of heatmaps took 0.2 s to make alone
# and 0.7-0.9 s beside the engine on two cores, so redrawn every half second they took half of what the engine had.
REDRAW_SHARE = 0.25
# ... counting the browser's drawing too, which the server does not see: Chromium drew a 64-step generation's pair
# of heatmaps (1.2 MB of chart JSON, ~7,700 SVG marks) in 0.6-0.7 s on the app's two cores (bench/stream.py), and
# a phone is no faster.
DRAWN_BYTES_PER_SECOND = 2_000_000
Components = dict[str, gr.components.Component]


class Pace:
    """When a page being written is redrawn: its text at most every REDRAW_SECONDS, its charts at most that often
    and so that their making (timed from the making to the page's next ask: the kept value written, Gradio's
    sending) and the browser's drawing of them (estimated from their bytes) take no more than REDRAW_SHARE of the
    time."""

    def __init__(self, text_first: bool = False):
        # monotonic times from which each is due again. `text_first`: the first step's text goes out alone (a
        # token's worth of bytes, on the page at once) and the charts wait their turn after it, as after a redraw.
        self.text_at = 0.0
        self.charts_at = math.inf if text_first else 0.0

    def charts_due(self) -> bool:
        return time.monotonic() >= self.charts_at

    def text_due(self) -> bool:
        return time.monotonic() >= self.text_at

    def drawn(self, started: float, sent_bytes: int = 0) -> None:
        """The charts (and the text) were made from `started` until now, `sent_bytes` of charts for the browser."""
        now = time.monotonic()
        cost = now - started + sent_bytes / DRAWN_BYTES_PER_SECOND
        self.charts_at = now + max(REDRAW_SECONDS, cost * (1 / REDRAW_SHARE - 1))
        self.text_at = now + REDRAW_SECONDS

    def texted(self) -> None:
        self.text_at = time.monotonic() + REDRAW_SECONDS
        if self.charts_at == math.inf:          # the first text went out alone: the charts' turn comes after it
            self.charts_at = self.text_at


def plot(chart: alt.TopLevelMixin | None) -> PlotData | None:
    """A chart as `gr.Plot`'s own data, built and serialised without Altair's schema validation.

    Validation walks every cell of the inline data with jsonschema: for a 389-token prompt's page it
    took ~1 s of the server's 7 s (0.3 s while building, 0.65 s in `to_json`). The charts are the same
    code whatever the data, and `tests/test_charts.py` validates each kind with `to_dict()`. Written without
    Altair's default indentation, which was a third of a chart's JSON (a short link's pair of heatmaps: 547 kB
    on the page; bench/link_speed.py), all of it sent, escaped and parsed again by the page.
    """
    if chart is None:
        return None
    return PlotData(type="altair", plot=chart.to_json(validate=False, indent=None))


def build_chart(make: Callable, *args, **kwargs) -> PlotData | None:
    """`plot(make(*args, **kwargs))`, with Altair's validation at construction off while it builds."""
    with alt.utils.schemapi.debug_mode(False):
        return plot(make(*args, **kwargs))


@dataclass
class TabParts:
    """A built tab. `run(values, request=None) -> updates`: its readout, from the values of `inputs` and
    `reads` by name to updates of `outputs` by name (None: the tab is unavailable, and `inputs` empty)."""

    view: TabView                                  # its kind, and what its link carries
    inputs: Components                             # input name -> component: what its link carries
    outputs: Components = field(default_factory=dict)
    run: Callable[..., dict] | None = None
    reads: Components = field(default_factory=dict)  # what else the readout reads (the link's note)
    run_button: gr.Button | None = None

    @property
    def name(self) -> str:
        return self.view.name

    def values(self, view: View) -> dict[gr.components.Component, Any]:
        """The inputs' values that show `view`, by component."""
        return {self.inputs[name]: value for name, value in self.view.values_of(view).items()}


def on(triggers, fn: Callable[..., dict], parts: Components, reads: Iterable[str], writes: Iterable[str],
       progress: bool = False, select: bool = False, stream: bool = False, **event):
    """Call `fn(values, request=...) -> updates` when a trigger fires (a list of them, or one listener such as
    `button.click` or `event.then`): `values` the `reads` components' values by name, `updates` values for any
    of the `writes` components by name (the others are left as they are). With `progress` fn gets a `progress`
    callable too; with `select`, the selection (`gr.SelectData`) after the values. With `stream`, fn yields its
    updates (a page written as the model writes), each sent as it comes.

    A kept state (`kept.py`) holds a handle and a recipe on the page: fn reads the value it names (made again from
    the recipe when the store let it go) and writes a value (or `kept.Kept`), kept under a new handle (the old one,
    read for that, is dropped)."""
    reads, writes = {name: parts[name] for name in reads}, {name: parts[name] for name in writes}
    replaced = {name: c for name, c in writes.items() if kept.is_kept(c)}      # their old handles

    def updates(out: dict, by_component: dict, request) -> dict:
        unknown = set(out) - set(writes)
        if unknown:
            raise KeyError(f"{fn} answered {sorted(unknown)}, which it does not write")
        return {c: (kept.write(c, out[name], by_component.get(c), request) if kept.is_kept(c) else out[name])
                if name in out else gr.skip() for name, c in writes.items()}       # Gradio takes {} for one value

    def values(by_component: dict, request) -> dict:
        return {name: kept.read(c, by_component[c], request) if kept.is_kept(c) else by_component[c]
                for name, c in reads.items()}

    if progress:
        def handler(by_component, request: gr.Request = None, bar=gr.Progress()):  # noqa: B008 - Gradio's way
            return updates(fn(values(by_component, request), request=request, progress=bar), by_component, request)
    elif stream:
        def handler(by_component, request: gr.Request = None):
            handles = dict(by_component)           # each kept value written replaces the one written before it
            for out in fn(values(by_component, request), request=request):
                written = updates(out, handles, request)
                handles.update({c: written[c] for name, c in replaced.items() if name in out})
                yield written
    elif select:
        def handler(by_component, evt: gr.SelectData, request: gr.Request = None):
            return updates(fn(values(by_component, request), evt), by_component, request)
    else:
        def handler(by_component, request: gr.Request = None):
            return updates(fn(values(by_component, request), request=request), by_component, request)
    handler.__name__ = getattr(fn, "__name__", None) or getattr(getattr(fn, "func", None), "__name__", "handler")
    # Gradio names an event after its function and gives a taken name a suffix: a UI handler called `describe`
    # made before the API's /describe took that name, and the API's became /describe_1. UI names never collide.
    event = {"api_name": f"ui_{handler.__name__}", **PRIVATE, **event}
    inputs, outputs = set(reads.values()) | set(replaced.values()), list(writes.values())
    if isinstance(triggers, list):
        return gr.on(triggers, handler, inputs=inputs, outputs=outputs, **event)
    return triggers(handler, inputs, outputs, **event)       # one listener: `button.click`, `event.then`


def show_progress_on_pictures(demo: gr.Blocks) -> None:
    """Every event of the page shows its progress on its charts and chat in view (a tab's picture), and an event
    that shows none sets none (`show_progress="hidden"` only hides it). Gradio's page keeps a loading state for
    every component any event has shown progress on and, at every message of every event, sets each one again by a
    walk of the page's whole component tree: a fresh link's load events (the restore writes every tab's inputs,
    the readout every tab's outputs) cost its first chart ~0.5 s of Chromium's time, and every status poll after
    it paid again for all the outputs the page had ever had (bench/RESULTS.md). A spinner over each table, code
    box and hidden state said nothing the picture's did not. Call once the page is built, before it is served."""
    for f in demo.fns.values():
        if f.show_progress_on is None:
            f.show_progress_on = [] if f.show_progress == "hidden" else [
                c for c in f.outputs if isinstance(c, (gr.Plot, gr.Chatbot)) and c.visible is True]


_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|~>])")


def how_to(text: str) -> None:
    """The folded "How to read this" under a tab's intro."""
    with gr.Accordion("How to read this", open=False):
        gr.Markdown(text)


def md_text(text: str) -> str:
    """Arbitrary text shown literally inside gr.Markdown (no markup, no HTML)."""
    return _MD_SPECIAL.sub(r"\\\1", html.escape(text, quote=False))


def table_html(df, caption: str) -> str:
    """A DataFrame as a plain HTML table with headers a screen reader announces; every text escaped."""
    def esc(x) -> str:
        return html.escape(str(x))
    head = "".join(f'<th scope="col">{esc(c)}</th>' for c in [df.index.name or "", *df.columns])
    body = "".join("<tr>" + f'<th scope="row">{esc(i)}</th>' + "".join(f"<td>{esc(v)}</td>" for v in row) + "</tr>"
                   for i, row in zip(df.index, df.itertuples(index=False)))
    return (f'<div style="overflow-x: auto"><table><caption>{esc(caption)}</caption><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>")


def int_or(value, default: int) -> int:
    """For building a View from inputs mid-edit (an emptied number box): never raises."""
    try:
        n = int(value)
    except (TypeError, ValueError, OverflowError):
        return default
    return n if abs(n) < 1 << 63 else default       # no link needs more (str() refuses past 4300 digits)


def new_seed() -> int:
    """A fresh seed to show in a seed box (the user sees it, so any sample can be had again)."""
    return random.randrange(0, 1_000_000)


def warn(message: str) -> None:
    gr.Warning(html.escape(message))

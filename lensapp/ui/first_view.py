"""What the browser does for a page's first view: a link's picture drawn before the page has started, the charts'
code fetched while the page starts, every lens chart opened on its last columns, and on a phone the picture before
the form's settings.

- A link's picture before the page (every tab's that the prefetch reads): Gradio takes ~1-1.5 s to
  build and mount a tab's ~60 components before the page sends its first event, where a bare page with one chart
  is drawn in ~1 s (bench/RESULTS.md). The link's GET has started its readout already (`prefetch.py`), which then
  keeps the chart the page will draw first (`FirstViews`, the tab's own: `lens_tab.first_heatmap`, the other
  tabs' `picture`), for the address whose GET started it. The page's HTML carries a script for it at the top of
  its head (`server.WithFirstView`; `static/first_view.js`, its settings as JSON: `settings_tag`), which asks for it
  with the ticket its own GET was handed (`/first-view?t=`: `FirstViews`) and draws it with Gradio's own Vega over
  the page while the page starts, until the tab's own chart is drawn and shown: the tab's first chart, found by the
  class each tab gives it (`FIRST_CHART`), not by a list of its own. While it covers the page it takes every click
  (the controls under it are not seen): a visitor who clicks on a picture expects to reach what they see, never a
  control hidden under it; and it stays until the chart that replaces it is there (gone at Gradio's start, the page
  would show that tab without its chart for the ~1-1.5 s Gradio takes to send its first event and draw the answer).
  A link whose readout the prefetch did not start has none: its page is as it was.
- Gradio's start (~0.5-0.8 s of the browser's main thread in one go, as it mounts the page) is held until the
  picture is painted: until `FIRST_VIEW_HOLD_MS` (1.2 s) after the navigation, unless by then all the picture needs
  is to be drawn, and never past `FIRST_VIEW_MAX_HOLD_MS` (1.6 s): the picture's answer came while Gradio started
  and waited for it, and was drawn 0.6-0.9 s after it had come (bench/RESULTS.md). Meanwhile the browser fetches
  and compiles the modules that start imports (`start_preloads`).

- The chart's code (Gradio's Altair plot and Vega, ~300 kB) is fetched when the first chart's data arrives, after
  the page has started; named in the page's head, the browser fetches and compiles it while the page starts
  (`preload_links`).
- A heatmap's last column is the prompt's last token, where the next token forms. A chart wider than its box
  (a phone's 390 px, or a long prompt's window) opens scrolled so that the first heatmap's last column is in
  view (`SCROLL_TO_LAST_COLUMN`): the side-by-side pair shows the Jacobian lens's, the logit lens a swipe on. The
  components' bars open on the last layers.
- On a narrow screen a tab's settings and examples (`PHONE_LATER`) come after its first chart (`FIRST_CHART`),
  so the picture starts within the first screen and a half (tests/test_first_view.py).
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import secrets
import threading
import time
from collections import Counter, OrderedDict
from concurrent.futures import Future
from pathlib import Path
from typing import Callable

from ..service.cache import BoundedLRU

# Classes a tab gives its parts (a component's elem_classes).
PHONE_LATER = "phone-later"          # settings and examples: after the first chart on a phone
FIRST_CHART = "first-chart"          # a tab's first chart: sent first (landing.py); on a phone, before the settings

FIRST_VIEW_ID = "lens-first-view"    # the picture drawn before the page (removed once the tab's chart is drawn)

CSS = f"""
@media (max-width: 640px) {{
  .{PHONE_LATER} {{ order: 1; }}
  .{FIRST_CHART} ~ * {{ order: 2; }}
}}
"""
# The picture's own style, sent with its script: it is drawn before Gradio has started and written its styles in.
# Dark where Gradio's page will be (`?__theme=dark`, or a browser that prefers dark): Gradio's dark body and text.
DARK_BACKGROUND, DARK_TEXT = "#0f0f11", "#f4f4f5"     # as Gradio 6 draws them (the test compares the two)
# It takes the pointer's events (the default): a click on the picture reaches no control under it.
FIRST_VIEW_CSS = f"""<style>
#{FIRST_VIEW_ID} {{
  position: fixed; inset: 0; z-index: 1000; overflow: auto; padding: 16px;
  background: var(--body-background-fill, #fff); color: var(--body-text-color, #27272a);
  font-family: ui-sans-serif, system-ui, sans-serif;
}}
#{FIRST_VIEW_ID}.dark {{ background: {DARK_BACKGROUND}; color: {DARK_TEXT}; }}
#{FIRST_VIEW_ID} p {{ margin: 0 0 12px; font-size: 14px; }}
#{FIRST_VIEW_ID} .altair {{ overflow-x: auto; max-width: 100%; }}
</style>"""

# Once per drawing (Vega replaces the SVG when a chart is drawn again): the box scrolled so that the rightmost cell
# over positions (or a generation's steps) of the first chart from the left is in view, or a bar chart's rightmost
# bar (the components' layers: the last ones, where the answer is written). Cells are Vega's rect marks; their
# aria-label lists their tooltip's fields, and only cells over positions or steps name one; a mark's cells are
# measured together, as their group (one box, not one per cell: 1,920 in a generation's heatmap). Looked for once a
# frame, not at each change of the page, and each drawing measured once: a box's width read at every change made
# the browser lay the page out again at each of a generation's steps (0.33 s of its main thread in a 64-token one).
SCROLL_TO_LAST_COLUMN = """<script>
(() => {
  if (window.lensScrolls) { return; }                 // a link's page has it twice: its first view's, Gradio's head
  window.lensScrolls = true;
  const overColumns = /(^|; )(position|step): /;
  const cell = "path[aria-roledescription='rect mark'], path[aria-roledescription='bar']";
  const columnar = (c) => c && (c.getAttribute("aria-roledescription") === "bar" ||
                                overColumns.test(c.getAttribute("aria-label") || ""));
  function toLastColumn(box) {
    const svg = box.querySelector("svg.marks");
    // not drawn yet, or in a tab not shown: looked at again at a later change
    if (!svg || svg.dataset.lensSeen || !svg.querySelector(cell) || !box.clientWidth) { return; }
    svg.dataset.lensSeen = "1";
    if (box.scrollWidth <= box.clientWidth + 1) { return; }
    const first = svg.querySelector("g.concat_0_group"), second = svg.querySelector("g.concat_1_group");
    const sideBySide = first && second &&
      second.getBoundingClientRect().left >= first.getBoundingClientRect().right - 1;
    const marks = [...(sideBySide ? first : svg).querySelectorAll("g.role-mark")]     // a mark's cells, together
      .filter((g) => columnar(g.querySelector(`:scope > :is(${cell})`)));
    if (!marks.length) { return; }
    const right = Math.max(...marks.map((g) => g.getBoundingClientRect().right));
    box.scrollLeft += Math.max(0, right - box.getBoundingClientRect().right + 8);
  }
  let due = false;
  new MutationObserver(() => {
    if (due) { return; }
    due = true;
    requestAnimationFrame(() => {
      due = false;
      document.querySelectorAll(".lens-plot .altair").forEach(toLastColumn);
    });
  }).observe(document, { childList: true, subtree: true });
})();
</script>"""


class FirstViews:
    """The first heatmap of each link whose readout the prefetch started, kept for the address whose GET started it
    (`owner`: as the guard derives it; a room behind one address finds what one of them opened), the newest
    `entries`, at most `max_bytes` of chart JSON in all (a cache: a picture forgotten is a page as it was). A query
    being read is pending: its page's ask waits for it, woken when it comes (`put`).

    A page asks with the ticket its own GET was handed (`ticket`: one ask each, from the address it was handed to,
    within `ticket_s`): an ask without one (a script's, another address's) is answered at once with nothing, the
    same whether or not anyone opened that link, and waits for nothing. So the asks that wait are at most the link
    GETs that started or found a readout of their own address, `tickets` of them at most (`tickets_each` per address:
    a room's worth) at any time."""

    def __init__(self, entries: int = 16, max_bytes: int = 8 << 20, tickets: int = 1024, tickets_each: int = 64,
                 ticket_s: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self.entries, self.max_bytes = entries, max_bytes
        self.tickets, self.tickets_each, self.ticket_s, self.clock = tickets, tickets_each, ticket_s, clock
        # (owner, query) -> its chart's JSON: the app's bounded-map shape, by entries and by bytes
        self._charts = BoundedLRU(max_bytes, getsizeof=len, max_entries=entries)
        self._pending: dict[tuple[str | None, str], Future] = {}        # (owner, query) -> its chart, once read
        self._tickets: OrderedDict[str, tuple[str | None, str, float]] = OrderedDict()   # -> (owner, query, until)
        self._held: Counter[str | None] = Counter()                     # owner -> its tickets
        self._lock = threading.Lock()

    def expect(self, owner: str | None, query: str) -> None:
        """`query`'s readout has started for `owner`: its chart follows (`put`)."""
        with self._lock:
            self._pending.setdefault((owner, query), Future())

    def put(self, owner: str | None, query: str, chart: str | None) -> None:
        """`query`'s chart as JSON for `owner` (None: none; its readout failed or was refused)."""
        with self._lock:
            if chart is not None and len(chart) <= self.max_bytes:
                self._charts[owner, query] = chart
            waiting = self._pending.pop((owner, query), None)
        if waiting is not None:
            waiting.set_result(chart)

    def knows(self, owner: str | None, query: str) -> bool:
        """Whether `query`'s chart is kept or on its way for `owner` (a room opening one link: the first visit
        started its readout, the others find it)."""
        with self._lock:
            return (owner, query) in self._charts or (owner, query) in self._pending

    def ticket(self, owner: str | None, query: str) -> str:
        """A ticket for one ask of `query`'s chart by `owner` (its page's: `get`)."""
        ticket, now = secrets.token_urlsafe(16), self.clock()
        with self._lock:
            while self._tickets and (next(iter(self._tickets.values()))[2] < now or len(self._tickets) >= self.tickets):
                self._drop(next(iter(self._tickets)))
            if self._held[owner] >= self.tickets_each:
                self._drop(next(t for t, (o, _, _) in self._tickets.items() if o == owner))
            self._tickets[ticket] = (owner, query, now + self.ticket_s)
            self._held[owner] += 1
        return ticket

    async def get(self, ticket: str | None, owner: str | None, wait: float) -> str | None:
        """The chart `ticket` names, for `owner` (the address asking), waiting up to `wait` seconds while its
        readout is under way; None at once for a ticket that is not `owner`'s, used or unknown."""
        with self._lock:
            named = self._tickets.get(ticket) if isinstance(ticket, str) else None
            if named is None or named[0] != owner:
                return None
            self._drop(ticket)
            if named[2] < self.clock():
                return None
            key = named[:2]
            chart, pending = self._charts.get(key), self._pending.get(key)
        if chart is not None or pending is None:
            return chart
        try:           # shielded: the read's own future is not cancelled with this ask
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(pending)), wait)
        except TimeoutError:
            return None

    def _drop(self, ticket: str) -> tuple[str | None, str, float] | None:
        named = self._tickets.pop(ticket, None)
        if named is not None:
            self._held[named[0]] -= 1
            if not self._held[named[0]]:
                del self._held[named[0]]
        return named


def embed_module(assets: Path | None = None) -> str | None:
    """The name of Gradio's module that draws a Vega-Lite chart (vega-embed: its default export), or None."""
    assets = assets or gradio_assets()
    for path in sorted(assets.glob("embed-*.js")):
        text = path.read_text(encoding="utf-8", errors="replace")
        if "vega" in text[:200_000] and re.search(r"export\{\w+ as default\};?\s*$", text[-300:]):
            return path.name
    return None


# Run by a link's page as it reads its HTML (`server.WithFirstView` puts it there, after its settings: `settings_tag`):
# the link's first chart asked for and drawn over the page while it starts, Gradio's start held meanwhile. A file
# shipped with the package, written into the page whole (a script fetched on its own would wait for its own round
# trip before it could ask for the picture).
FIRST_VIEW_JS = Path(__file__).parent / "static" / "first_view.js"
SETTINGS_ID = "lens-first-view-settings"
FIRST_VIEW_MAX_MS = 20_000          # the picture goes by then whatever the page does
# Gradio's start waits for the picture until FIRST_VIEW_HOLD_MS after the navigation, unless by then all the picture
# needs is to be drawn (its answer and Vega are in: 0.25-0.3 s more, bench/RESULTS.md), and never past
# FIRST_VIEW_MAX_HOLD_MS.
FIRST_VIEW_HOLD_MS = 1_200
FIRST_VIEW_MAX_HOLD_MS = 1_600


@functools.cache
def first_view_settings() -> dict:
    """The first view's settings but a page's ticket (vega-embed's module: None where this Gradio has none)."""
    return {"embed": embed_module(), "id": FIRST_VIEW_ID, "chart": f".{FIRST_CHART}", "holdMs": FIRST_VIEW_HOLD_MS,
            "maxHoldMs": FIRST_VIEW_MAX_HOLD_MS, "maxMs": FIRST_VIEW_MAX_MS}


def settings_tag(ticket: str) -> str:
    """A link's page's first-view settings, its ticket among them (`FirstViews.ticket`), as JSON the script reads."""
    text = json.dumps({**first_view_settings(), "ticket": ticket}).replace("<", "\\u003c")
    return f'<script type="application/json" id="{SETTINGS_ID}">{text}</script>'


def first_view_script(assets: Path | None = None) -> str:
    """The first view's script and what it needs in a page's head, but its settings ("" where this Gradio has no
    vega-embed module by that name: links open as before)."""
    if embed_module(assets) is None:
        return ""
    script = f"<script>\n{FIRST_VIEW_JS.read_text(encoding='utf-8')}</script>"
    return start_preloads(assets) + preload_links(assets) + FIRST_VIEW_CSS + SCROLL_TO_LAST_COLUMN + script


def gradio_assets() -> Path:
    """Gradio's built page: its scripts and styles."""
    import gradio

    return Path(gradio.__file__).parent / "templates" / "frontend" / "assets"


def preload_links(assets: Path | None = None) -> str:
    """`<link rel=modulepreload>` for Gradio's Altair plot module and the modules it imports ("" when this Gradio
    has none by that name: the page then fetches it as before)."""
    assets = assets or gradio_assets()
    found = sorted(assets.glob("AltairPlot-*.js"))
    if not found:
        return ""
    head = found[0].read_text(encoding="utf-8", errors="replace")[:4000]
    modules = [found[0].name, *re.findall(r'from"\./([\w.-]+\.js)"', head)]
    return "".join(f'<link rel="modulepreload" href="./assets/{name}">' for name in dict.fromkeys(modules))


def start_preloads(assets: Path | None = None) -> str:
    """`<link rel=modulepreload>` for the modules Gradio's start imports (its index module's dependencies: the app and
    its runtime), fetched and compiled while a link's page holds its start for the first view ("" when this Gradio
    names none that way)."""
    assets = assets or gradio_assets()
    page = assets.parent / "index.html"
    html = page.read_text(encoding="utf-8") if page.exists() else ""
    found = re.search(r'src="\./assets/(index-[\w-]+\.js)"', html)
    start = assets / found.group(1) if found else None
    text = start.read_text(encoding="utf-8", errors="replace")[:4000] if start and start.exists() else ""
    deps = re.search(r"m\.f\|\|\(m\.f=\[([^\]]*)\]", text)
    names = re.findall(r'"\./([\w.-]+\.js)"', deps.group(1)) if deps else []
    return "".join(f'<link rel="modulepreload" href="./assets/{name}">' for name in names)


def head() -> str:
    return preload_links() + SCROLL_TO_LAST_COLUMN


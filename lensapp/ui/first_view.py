"""What the browser does for a page's first view: a link's picture drawn before the page has started, the charts'
code fetched while the page starts, every lens chart opened on its last columns, and on a phone the picture before
the form's settings.

- A link's picture before the page (every tab's that the prefetch reads): Gradio takes ~1-1.5 s to
  build and mount a tab's ~60 components before the page sends its first event, where a bare page with one chart
  is drawn in ~1 s (bench/RESULTS.md). The link's GET has started its readout already (`prefetch.py`), which then
  keeps the chart the page will draw first (`FirstViews`, the tab's own: `lens_tab.first_heatmap`, the other
  tabs' `picture`). The page's HTML carries a script for it at the top of its head (`server.WithFirstView`),
  which asks for it (`/first-view`, the link's query) and draws it with Gradio's own Vega (`FIRST_VIEW`) over the
  page while the page starts, until the tab's own chart is drawn. A link whose readout the prefetch did not start
  has none: its page is as it was.
- Gradio's start (~0.5-0.8 s of the browser's main thread in one go, as it mounts the page) is held until the
  picture is painted, for at most `FIRST_VIEW_HOLD_MS`: the picture's answer came while Gradio started and waited
  for it, and was drawn 0.6-0.9 s after it had come (bench/RESULTS.md). Meanwhile the browser fetches and compiles
  the modules that start imports (`start_preloads`).

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
import json
import re
import threading
import time
from collections import OrderedDict
from pathlib import Path

# Classes a tab gives its parts (a component's elem_classes).
PHONE_LATER = "phone-later"          # settings and examples: after the first chart on a phone
FIRST_CHART = "first-chart"          # a tab's first chart: sent first (landing.py); on a phone, before the settings

FIRST_VIEW_ID = "lens-first-view"    # the picture drawn before the page (removed once the tab's chart is drawn)
# Each tab whose link has one (`prefetch.py` keeps its first chart), and that chart's element on the page.
LINK_CHARTS = {"logit": "logit-heatmap", "jacobian": "jacobian-heatmap", "generate": "generate-heatmap",
               "compare": "compare-heatmaps",
               "intervene": "intervene-pair", "components": "components-by-layer"}

CSS = f"""
@media (max-width: 640px) {{
  .{PHONE_LATER} {{ order: 1; }}
  .{FIRST_CHART} ~ * {{ order: 2; }}
}}
"""
# The picture's own style, sent with its script: it is drawn before Gradio has started and written its styles in.
# Dark where Gradio's page will be (`?__theme=dark`, or a browser that prefers dark): Gradio's dark body and text.
DARK_BACKGROUND, DARK_TEXT = "#0f0f11", "#f4f4f5"     # as Gradio 6 draws them (the test compares the two)
FIRST_VIEW_CSS = f"""<style>
#{FIRST_VIEW_ID} {{
  position: fixed; inset: 0; z-index: 1000; overflow: auto; padding: 16px;
  background: var(--body-background-fill, #fff); color: var(--body-text-color, #27272a);
  font-family: ui-sans-serif, system-ui, sans-serif; pointer-events: none;
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
    """The first heatmap of each link whose readout the prefetch started, by the link's query, until its page asks
    for it: the newest `entries`, at most `max_bytes` of chart JSON in all (a cache: a picture forgotten is a page
    as it was). A query being read is pending: its page's ask waits for it."""

    def __init__(self, entries: int = 16, max_bytes: int = 8 << 20):
        self.entries, self.max_bytes = entries, max_bytes
        self._charts: OrderedDict[str, str] = OrderedDict()
        self._pending: set[str] = set()
        self._lock = threading.Lock()

    def expect(self, query: str) -> None:
        """`query`'s readout has started: its chart follows (`put`)."""
        with self._lock:
            self._pending.add(query)

    def put(self, query: str, chart: str | None) -> None:
        """`query`'s chart as JSON (None: none; its readout failed or was refused)."""
        with self._lock:
            if chart is not None and len(chart) <= self.max_bytes:
                self._charts[query] = chart
                self._charts.move_to_end(query)
                while len(self._charts) > self.entries or sum(map(len, self._charts.values())) > self.max_bytes:
                    self._charts.popitem(last=False)
            self._pending.discard(query)

    def knows(self, query: str) -> bool:
        """Whether `query`'s chart is kept or on its way (a room opening one link: the first visit started its
        readout, the others find it)."""
        with self._lock:
            return query in self._charts or query in self._pending

    async def get(self, query: str, wait: float) -> str | None:
        """`query`'s chart, waiting up to `wait` seconds while its readout is under way; None: there is none."""
        deadline = time.monotonic() + wait
        while True:
            with self._lock:
                chart, pending = self._charts.get(query), query in self._pending
            if chart is not None or not pending or time.monotonic() >= deadline:
                return chart
            await asyncio.sleep(0.05)


def embed_module(assets: Path | None = None) -> str | None:
    """The name of Gradio's module that draws a Vega-Lite chart (vega-embed: its default export), or None."""
    assets = assets or gradio_assets()
    for path in sorted(assets.glob("embed-*.js")):
        text = path.read_text(encoding="utf-8", errors="replace")
        if "vega" in text[:200_000] and re.search(r"export\{\w+ as default\};?\s*$", text[-300:]):
            return path.name
    return None


# Run by a link's page as it reads its HTML (`server.WithFirstView` puts it there): the link's first chart
# asked for (`/first-view`) and Gradio's vega-embed module loaded at once, the picture drawn over the page (it lets
# every click through: the page under it is the page) unless the tab has drawn its own already, and removed as soon
# as it has, or an error is shown, or after MAX_MS.
FIRST_VIEW = """<script>
(() => {
  const charts = LINKS, tab = new URLSearchParams(location.search).get("tab");
  if (!Object.hasOwn(charts, tab)) { return; }
  // Gradio starts the page when its <gradio-app> element is defined (its index module, which Vega's module
  // imports too): held until the picture is painted or there is none, so that its start does not keep the
  // picture's answer waiting on the browser's main thread; at HOLD_MS after the navigation, unless all the picture
  // needs by then is to be drawn (its answer and Vega are in), it starts anyway.
  const define = customElements.define;
  let started = false, held = null;
  const start = () => {
    if (started) { return; }
    started = true;
    customElements.define = define;
    if (held) { held(); }
  };
  customElements.define = function (name, ...rest) {
    if (name !== "gradio-app" || started) { return define.call(this, name, ...rest); }
    held = () => define.call(customElements, name, ...rest);
  };
  const times = window.lensFirstView = {};            // when each part came (bench/link_speed.py reads them)
  setTimeout(() => { if (!times.asked || !times.vega) { start(); } }, Math.max(0, HOLD_MS - performance.now()));
  setTimeout(start, Math.max(0, 3 * HOLD_MS - performance.now()));   // whatever the drawing does, the page starts
  const chart = `#${charts[tab]} svg.marks g.role-mark path`;
  const asked = fetch(new URL("first-view" + location.search, location.href))
    .then((r) => (r.status === 200 ? r.json() : null)).catch(() => null)
    .then((spec) => { times.asked = performance.now(); return spec; });
  const vega = import("./assets/EMBED").then((m) => m.default).catch(() => null)
    .then((embed) => { times.vega = performance.now(); return embed; });
  Promise.all([asked, vega]).then(async ([spec, embed]) => {
    if (!spec || !embed || document.querySelector(chart)) { start(); return; }
    spec.usermeta = { ...spec.usermeta, embedOptions: { ...spec.usermeta?.embedOptions, actions: false } };
    const view = document.createElement("div");
    view.id = "ID";
    // Gradio's page is dark where the link says so or the browser prefers it: the picture's page is too (its chart
    // as Gradio draws it there, on Vega's white)
    const theme = new URLSearchParams(location.search).get("__theme");
    const dark = (theme || (matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light")) === "dark";
    view.classList.toggle("dark", dark);
    view.setAttribute("aria-hidden", "true");         // the page under it reads the same cells, and more
    view.innerHTML = "<p>The link's picture, while the page opens: hovering, the settings and the rest " +
      "follow in a moment.</p>";
    const box = document.createElement("div");
    box.className = "altair";                         // scrolled to its first chart's last column, as every chart
    const plot = document.createElement("div");
    plot.className = "lens-plot";
    plot.appendChild(box);
    view.appendChild(plot);
    document.body.appendChild(view);
    const gone = () => view.remove();
    const watch = new MutationObserver(() => {
      if (document.querySelector(chart) || document.querySelector(".toast-body.error")) { watch.disconnect(); gone(); }
    });
    watch.observe(document, { childList: true, subtree: true });
    setTimeout(() => { watch.disconnect(); gone(); }, MAX_MS);
    await embed(box, spec, { renderer: "svg" });
    times.drawn = performance.now();
    times.started = started;                          // whether the page started before the picture was drawn
    requestAnimationFrame(() => setTimeout(start, 0));   // painted: the page starts
  }).catch(start);
})();
</script>"""
FIRST_VIEW_MAX_MS = 20_000
FIRST_VIEW_HOLD_MS = 1_200


def first_view_script(assets: Path | None = None) -> str:
    """`FIRST_VIEW` for this Gradio ("" where it has no vega-embed module by that name: links open as before)."""
    embed = embed_module(assets)
    if embed is None:
        return ""
    script = (FIRST_VIEW.replace("LINKS", json.dumps(LINK_CHARTS)).replace("EMBED", embed)
              .replace('"ID"', f'"{FIRST_VIEW_ID}"').replace("MAX_MS", str(FIRST_VIEW_MAX_MS))
              .replace("HOLD_MS", str(FIRST_VIEW_HOLD_MS)))
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


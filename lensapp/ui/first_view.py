"""What the browser does for a page's first view: the charts' code fetched while the page starts, every lens chart
opened on its last columns, and on a phone the picture before the form's settings.

- The chart's code (Gradio's Altair plot and Vega, ~300 kB) is fetched when the first chart's data arrives, after
  the page has started; named in the page's head, the browser fetches and compiles it while the page starts
  (`preload_links`).
- A heatmap's last column is the prompt's last token, where the next token forms. A chart wider than its box
  (a phone's 390 px, or a long prompt's window) opens scrolled so that the first heatmap's last column is in
  view (`SCROLL_TO_LAST_COLUMN`): the side-by-side pair shows the Jacobian lens's, the logit lens a swipe on.
- On a narrow screen a tab's settings and examples (`PHONE_LATER`) come after its first chart (`FIRST_CHART`),
  so the picture starts within the first screen and a half (tests/test_first_view.py).
"""

from __future__ import annotations

import re
from pathlib import Path

# Classes a tab gives its parts (a component's elem_classes).
PHONE_LATER = "phone-later"          # settings and examples: after the first chart on a phone
FIRST_CHART = "first-chart"          # a tab's first chart: sent first (landing.py); on a phone, before the settings

CSS = f"""
@media (max-width: 640px) {{
  .{PHONE_LATER} {{ order: 1; }}
  .{FIRST_CHART} ~ * {{ order: 2; }}
}}
"""

# Once per drawing (Vega replaces the SVG when a chart is drawn again): the box scrolled so that the rightmost cell
# over positions (or a generation's steps) of the first chart from the left is in view. Cells are Vega's rect marks;
# their aria-label lists their tooltip's fields, and only cells over positions or steps name one; a mark's cells are
# measured together, as their group (one box, not one per cell: 1,920 in a generation's heatmap). Looked for once a
# frame, not at each change of the page, and each drawing measured once: a box's width read at every change made
# the browser lay the page out again at each of a generation's steps (0.33 s of its main thread in a 64-token one).
SCROLL_TO_LAST_COLUMN = """<script>
(() => {
  const overColumns = /(^|; )(position|step): /;
  const cell = "path[aria-roledescription='rect mark']";
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
      .filter((g) => overColumns.test(g.querySelector(`:scope > ${cell}`)?.getAttribute("aria-label") || ""));
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


def preload_links(assets: Path | None = None) -> str:
    """`<link rel=modulepreload>` for Gradio's Altair plot module and the modules it imports ("" when this Gradio
    has none by that name: the page then fetches it as before)."""
    if assets is None:
        import gradio

        assets = Path(gradio.__file__).parent / "templates" / "frontend" / "assets"
    found = sorted(assets.glob("AltairPlot-*.js"))
    if not found:
        return ""
    head = found[0].read_text(encoding="utf-8", errors="replace")[:4000]
    modules = [found[0].name, *re.findall(r'from"\./([\w.-]+\.js)"', head)]
    return "".join(f'<link rel="modulepreload" href="./assets/{name}">' for name in dict.fromkeys(modules))


def head() -> str:
    return preload_links() + SCROLL_TO_LAST_COLUMN

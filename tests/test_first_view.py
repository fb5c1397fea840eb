"""A link's first view on a phone (390 x 844) in Chromium, on the tiny app (`ui/first_view.py`, issue 50): the
picture begins within the first screen and a half (the settings and examples after it), and every lens chart
opens on its last column, where the answer forms: the column's cells are in view without a swipe."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from test_first_minute import WIDTHS, tiny_url, visit  # noqa: F401 - the module's tiny app, and a visit at a width
from test_ui_browser import wait_plot

from lensapp.ui import first_view

# Wider than a phone's chart box: the last column is off screen unless the chart opens scrolled to it.
PROMPT = "The capital of France is a city on the river Seine, and its name is"

# The cells of the first chart from the left (a pair side by side: its first) at its largest position.
LAST_COLUMN = """(sel) => {
  const plot = document.querySelector(sel), svg = plot.querySelector("svg.marks");
  const box = plot.querySelector(".altair"), frame = box.getBoundingClientRect();
  const first = svg.querySelector("g.concat_0_group"), second = svg.querySelector("g.concat_1_group");
  const sideBySide = first && second &&
    second.getBoundingClientRect().left >= first.getBoundingClientRect().right - 1;
  const cells = [...(sideBySide ? first : svg).querySelectorAll("path[aria-roledescription='rect mark']")]
    .map((c) => [Number((/(?:^|; )position: (\\d+)/.exec(c.getAttribute("aria-label")) || [])[1]), c])
    .filter(([pos]) => !Number.isNaN(pos));
  const last = Math.max(...cells.map(([pos]) => pos));
  const rects = cells.filter(([pos]) => pos === last).map(([, c]) => c.getBoundingClientRect());
  return {last, n: rects.length, left: Math.min(...rects.map((r) => r.left)),
          right: Math.max(...rects.map((r) => r.right)), boxLeft: frame.left, boxRight: frame.right,
          wider: box.scrollWidth > box.clientWidth, top: plot.getBoundingClientRect().top + scrollY};
}"""


@pytest.mark.parametrize("tab", ["jacobian", "logit"])
def test_a_phone_sees_a_links_last_column_within_a_screen_and_a_half(browser, tiny_url, tab):  # noqa: F811
    width, height = WIDTHS["phone"]
    page = visit(browser, tiny_url, "phone", f"tab={tab}&prompt={quote(PROMPT)}")
    wait_plot(page, f"{tab}-heatmap")
    page.wait_for_function("s => document.querySelector(s + ' svg.marks')?.dataset.lensSeen", arg=f"#{tab}-heatmap",
                           timeout=30_000)                             # the chart scrolled as it was drawn
    assert page.evaluate("scrollY") == 0
    seen = page.evaluate(LAST_COLUMN, f"#{tab}-heatmap")
    assert seen["top"] < 1.5 * height, seen                            # the picture begins within 1.5 screens
    assert seen["wider"] and seen["n"] > 0, seen                       # a chart a phone must scroll
    assert seen["boxLeft"] - 1 <= seen["left"] and seen["right"] <= seen["boxRight"] + 1, seen
    assert 0 <= seen["left"] and seen["right"] <= width, seen          # in view without a swipe
    prompt, chart = page.locator(f"#{tab}-prompt").bounding_box(), page.locator(f"#{tab}-heatmap").bounding_box()
    assert prompt["y"] < chart["y"]                                    # the prompt stays above the picture
    layers = page.locator(f"#{tab}-layers").bounding_box()
    assert layers["y"] > chart["y"]                                    # the settings come after it
    assert not page.errors
    page.context.close()


@pytest.mark.parametrize(("query", "chart"), [
    ("tab=generate&prompt=Hi", "generate-heatmap"), ("tab=compare&prompt1=Hi&prompt2=Ho", "compare-heatmaps"),
    ("tab=intervene&prompt=Hi&word=Rome&layer=2", "intervene-pair"),
    ("tab=components&prompt=Hi&target=Paris&foil=Rome", "components-by-layer")])
def test_every_tabs_picture_begins_within_a_screen_and_a_half_on_a_phone(browser, tiny_url, query,  # noqa: F811
                                                                        chart):
    page = visit(browser, tiny_url, "phone", query)
    wait_plot(page, chart)
    top = page.evaluate("(sel) => document.querySelector(sel).getBoundingClientRect().top + scrollY", f"#{chart}")
    assert top < 1.5 * WIDTHS["phone"][1], top
    assert not page.errors
    page.context.close()


def test_a_wide_screen_keeps_its_layout(browser, tiny_url):  # noqa: F811
    page = visit(browser, tiny_url, "desktop", f"tab=jacobian&prompt={quote(PROMPT)}")
    wait_plot(page, "jacobian-heatmap")
    chart, layers = page.locator("#jacobian-heatmap").bounding_box(), page.locator("#jacobian-layers").bounding_box()
    assert layers["y"] < chart["y"]                                    # the form above the picture, as before
    assert not page.errors
    page.context.close()


def test_the_preloaded_modules_are_gradios_own(tmp_path):
    (tmp_path / "AltairPlot-x1.js").write_text('import{a as b}from"./index-y.js";import{c}from"./dsv-z.js";')
    assert first_view.preload_links(tmp_path) == ('<link rel="modulepreload" href="./assets/AltairPlot-x1.js">'
                                                  '<link rel="modulepreload" href="./assets/index-y.js">'
                                                  '<link rel="modulepreload" href="./assets/dsv-z.js">')
    assert first_view.preload_links(tmp_path / "none") == ""
    assert "AltairPlot-" in first_view.preload_links()                 # this Gradio's, found

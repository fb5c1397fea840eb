"""A page's first events in Chromium, on the tiny app (`ui/landing.py`): a link's readout is asked with the page's
first events, not after a chain of them; its chart comes first and the rest of the readout follows; the front page
still draws every tab's example. The page's own clock and its event stream are read by bench/timeline.js, the
script bench/link_speed.py measures with."""

from __future__ import annotations

import json
import urllib.request
from urllib.parse import quote

import pytest
from conftest import REPO
from test_first_minute import tiny_url, visit  # noqa: F401 - the module's tiny app, and a visit at a width
from test_ui_browser import cells, open_tab, wait_plot

TIMELINE = REPO / "bench" / "timeline.js"
PROMPT = "The capital of France is"


def timed_visit(browser, url: str, query: str, chart: str):
    """A visit whose events and their answers `timeline.js` records, until `chart` is drawn."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.errors = []
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.add_init_script(f"window.LENS_CHART = {json.dumps('#' + chart)};")
    page.add_init_script(path=str(TIMELINE))
    page.goto(f"{url}?{query}")
    page.wait_for_function("window.lensTimeline.drawn !== null", timeout=90_000, polling=100)
    return page, page.evaluate("window.lensTimeline")


def load_events(url: str) -> set[int]:
    """The events the page sends as it loads (not after another event)."""
    with urllib.request.urlopen(url + "config", timeout=30) as r:
        deps = json.load(r)["dependencies"]
    return {d["id"] for d in deps if any(trigger == "load" for _, trigger in d["targets"])}


def chart_answer(timeline: dict) -> tuple[int, dict]:
    """The event whose answer carried the chart (its largest output), and that answer."""
    fn_of = {j.get("event"): j["fn"] for j in timeline["joins"]}
    answers = [m for m in timeline["msgs"] if m.get("items") and m["t"] <= timeline["drawn"]]
    answer = max(answers, key=lambda m: max(m["items"]))
    return fn_of[answer["event"]], answer


@pytest.mark.parametrize("tab", ["jacobian", "logit", "generate"])
def test_a_links_readout_is_asked_with_the_pages_first_events(browser, tiny_url, tab):  # noqa: F811
    chart = {"generate": "generate-heatmap"}.get(tab, f"{tab}-heatmap")
    page, timeline = timed_visit(browser, tiny_url, f"tab={tab}&prompt={quote(PROMPT)}", chart)
    fn, answer = chart_answer(timeline)
    assert fn in load_events(tiny_url), (fn, timeline["joins"])       # not a step after the restore
    # the chart's answer is the chart and the lines above it: no table, no second chart (each over a kB here)
    assert sum(size > 1024 for size in answer["items"]) == 1, answer["items"]
    page.context.close()


def test_the_rest_of_a_links_readout_follows_its_chart(browser, tiny_url):  # noqa: F811
    page, _ = timed_visit(browser, tiny_url, f"tab=jacobian&prompt={quote(PROMPT)}", "jacobian-heatmap")
    wait_plot(page, "jacobian-diff")                                   # the second chart
    page.wait_for_function("(document.querySelector('#jacobian-table') || {}).innerText?.includes('Jacobian lens')",
                           timeout=30_000)                             # the top-k table
    page.wait_for_selector("#jacobian-strip svg.marks g.role-mark path", timeout=30_000)
    assert page.input_value("#jacobian-prompt textarea") == PROMPT    # the restore beside it
    assert len(cells(page, "jacobian-heatmap")) > 0
    assert not page.errors
    page.context.close()


def test_the_front_page_draws_every_tabs_example_past_one_that_fails(browser, tiny_url):  # noqa: F811
    page = visit(browser, tiny_url, "desktop")
    wait_plot(page, "jacobian-heatmap")
    # the tiny model's 4 layers have no layer -8: Intervene's example fails there, and the one after it is drawn
    for tab, plot in {"Logit lens": "logit-heatmap", "Generation": "generate-heatmap", "Compare": "compare-heatmaps",
                      "Components": "components-by-layer"}.items():
        open_tab(page, tab)
        wait_plot(page, plot)
    assert not page.errors
    page.context.close()

"""The tabs' events wired by name, in Chromium, on the tiny app (seconds, where the vLLM app takes minutes):
the front page draws each tab's example, the link box follows an input and the tab in view, a link restores
its tab's inputs by name and runs it, and the handlers each tab's controls call answer on the page (a
position's table, a generation's step, the chat, a patch's cell pick)."""

from __future__ import annotations

import json
import time
import urllib.request
from urllib.parse import parse_qs, urlparse

import pytest

from lensapp import config

RUN = 120_000         # ms


@pytest.fixture(scope="module")
def tiny_url(tiny_service):
    from tiny_app import served

    from lensapp.server import make_app

    with served(make_app(tiny_service, config.Config.of(rate_limit=0))) as url:
        yield url


def answered(url: str) -> int:
    """How many requests the app has answered: the engine's served calls and the result cache's hits."""
    with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=30) as r:
        h = json.loads(r.read())
    return h["calls"]["served"] + h["cache"]["hits"]


def box(page, elem_id: str):
    return page.locator(f"#{elem_id} textarea, #{elem_id} input").first


def query(page) -> dict:
    return {k: v[0] for k, v in parse_qs(urlparse(page.url).query, keep_blank_values=True).items()}


def wait_plot(page, elem_id: str) -> None:
    page.wait_for_selector(f"#{elem_id} svg.marks g.role-mark path", timeout=RUN)


def test_the_front_page_draws_every_tab_and_the_link_follows_by_name(page, tiny_url):
    page.goto(tiny_url)
    wait_plot(page, "jacobian-heatmap")                            # it lands on both lenses (a J lens is loaded)
    page.get_by_role("tab", name="Logit lens").first.click()
    wait_plot(page, "logit-heatmap")
    box(page, "logit-k").fill("3")
    box(page, "logit-k").press("Tab")
    page.wait_for_function("() => location.search.includes('k=3')", timeout=30_000)
    assert query(page)["tab"] == "logit" and query(page)["prompt"] == "The capital of France is"
    for tab, plot in (("Jacobian lens", "jacobian-heatmap"), ("Generation", "generate-heatmap"),
                      ("Compare", "compare-heatmaps")):
        page.get_by_role("tab", name=tab).first.click()
        wait_plot(page, plot)
    page.get_by_role("tab", name="Intervene").first.click()        # its example steers at -8: not a tiny model's
    page.wait_for_function("() => location.search.includes('tab=intervene')", timeout=30_000)
    assert query(page)["word"] == "Rome" and query(page)["layer"] == "-8"          # the tab's own link, by name
    assert not page.errors


def test_a_link_restores_its_tab_by_name_and_its_controls_answer(page, tiny_url):
    page.goto(tiny_url + "?v=1&tab=generate&prompt=Once%20upon&max_tokens=3&temperature=0.8&seed=7&layers=1-3&k=2")
    wait_plot(page, "generate-heatmap")
    assert box(page, "generate-seed").input_value() == "7" and box(page, "generate-layers").input_value() == "1-3"
    first = page.locator("#generate-text textarea").input_value()
    page.locator("#generate-step input").click()
    page.get_by_role("option").first.click()                         # the step's table, through pick_step
    page.wait_for_selector("#generate-table [role=grid]", timeout=30_000)
    page.get_by_role("tab", name="Chat").click()
    box(page, "chat-message").fill("Hi")
    box(page, "chat-message").press("Enter")
    page.locator("#chat .lens-readout").first.wait_for(timeout=RUN)   # the reply and its readout, through send
    page.get_by_role("tab", name="Step by step").click()
    asked = answered(tiny_url)
    page.locator("#generate-run").click()
    # the same seed, the same text: once the rerun was answered (computed, or found in the result cache: the text
    # is the same before it, so waiting on the text alone could not fail) and its answer has reached the page
    deadline = time.monotonic() + RUN / 1000
    while answered(tiny_url) == asked and time.monotonic() < deadline:
        time.sleep(0.2)
    assert answered(tiny_url) > asked, "Generate asked nothing"
    page.wait_for_timeout(1500)
    assert page.locator("#generate-text textarea").input_value() == first
    assert not page.errors


def test_a_patch_link_runs_and_a_click_on_the_source_table_picks_its_cell(page, tiny_url):
    page.goto(tiny_url + "?v=1&tab=intervene&prompt=The%20capital%20of%20France%20is&intervention=patch"
                         "&source=The%20capital%20of%20Italy%20is&layer=1-2&positions=-1")
    wait_plot(page, "intervene-pair")
    table = page.locator("#intervene-source-table")
    table.wait_for(timeout=RUN)
    table.locator("[data-testid='cell-1-2']").click()             # row 1: layer 2; column 2: position 1
    page.wait_for_function("() => document.querySelector('#intervene-source-positions textarea, "
                           "#intervene-source-positions input').value === '1'", timeout=30_000)
    assert box(page, "intervene-layer").input_value() == "2"
    assert not page.errors


def test_a_bad_input_leaves_the_last_picture_in_view(page, tiny_url):
    """A run that fails (a prompt over the model's length) says so in one line and on its picture, and the picture
    it had stays in view under Gradio's "Error" pill, its cells answering: the pill's veil was opaque and hid it."""
    page.goto(tiny_url + "?v=1&tab=logit&prompt=The%20capital%20of%20France%20is")
    wait_plot(page, "logit-heatmap")
    drawn = page.locator("#logit-heatmap g.role-mark path").count()
    box(page, "logit-prompt").fill("one two three four five six seven eight nine ten " * 30)
    page.locator("#logit-run").click()
    page.wait_for_selector("#logit-heatmap [data-testid='status-tracker'] .clear-status", timeout=RUN)
    assert "the limit is" in page.locator(".toast-body").first.inner_text()
    assert page.locator("#logit-heatmap g.role-mark path").count() == drawn
    veil = page.eval_on_selector("#logit-heatmap [data-testid='status-tracker']",
                                 "e => getComputedStyle(e).backgroundColor")
    assert veil == "rgba(0, 0, 0, 0)"
    first = page.locator("#logit-heatmap g.role-mark path[aria-roledescription='rect mark']").first
    first.scroll_into_view_if_needed()
    cell = first.bounding_box()
    hit = page.evaluate("([x, y]) => !!document.elementFromPoint(x, y).closest('#logit-heatmap svg.marks')",
                        [cell["x"] + cell["width"] / 2, cell["y"] + cell["height"] / 2])
    assert hit                                                        # what a hover there meets is the chart

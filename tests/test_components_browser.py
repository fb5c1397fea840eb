"""The Components tab in Chromium on the running app (conftest's `app_url`: the embedded model on vLLM): a link
restores it and it draws, a logit-lens cell opens the components of that cell in one click, and hostile input
gets one line."""

from __future__ import annotations

import time
from urllib.parse import quote

from test_ui_browser import RUN_TIMEOUT, blind_event_urls, cells, field, open_app, shot, wait_plot

FRANCE = "The capital of France is"
LINK = f"v=1&tab=components&prompt={quote(FRANCE)}&target=Paris&foil=Rome&position=-1&patterns=23"


def test_a_components_link_restores_the_view_and_it_draws(page, app_url):
    blind_event_urls(page)
    open_app(page, app_url, LINK)
    for plot in ("components-by-layer", "components-by-head", "components-pattern-row", "components-pattern-grid"):
        wait_plot(page, plot)
    assert page.get_by_role("tab", name="Components").get_attribute("aria-selected") == "true"
    assert (field(page, "components-target").input_value(), field(page, "components-foil").input_value(),
            field(page, "components-patterns").input_value()) == ("Paris", "Rome", "23")
    heads = cells(page, "components-by-head")
    assert len(heads) == 30 * 9 and {int(c["layer"]) for c in heads} == set(range(30))
    summary = page.inner_text("#components-summary")
    assert "layer 23, head 4" in summary and "␣France" in summary           # the head that moves France to Paris
    assert "the parts sum to" in summary
    page.get_by_text("Show the code").last.click()
    page.wait_for_function("() => document.querySelector('#components-code')?.innerText.includes('TARGET, FOIL')",
                           timeout=30_000)
    shot(page, "components")
    with page.expect_download() as download:
        page.get_by_role("button", name="Download CSV").locator("visible=true").first.click()
    assert open(download.value.path(), encoding="utf-8").readline().strip() == "part,layer,head,value"
    assert not page.errors and not page.dialogs


def test_a_lens_cell_opens_its_components_in_one_click(page, app_url):
    blind_event_urls(page)
    open_app(page, app_url, f"v=1&tab=logit&prompt={quote(FRANCE)}&layers=20-29&k=3")
    wait_plot(page, "logit-heatmap")
    got = cells(page, "logit-heatmap")
    last = max(int(c["position"]) for c in got)
    index = next(i for i, c in enumerate(got) if int(c["layer"]) == 29 and int(c["position"]) == last)
    assert got[index]["#1"].startswith("␣Paris")
    pages = len(page.context.pages)
    page.locator("#logit-heatmap path[aria-roledescription='rect mark']").nth(index).click(
        position={"x": 3, "y": 3}, force=True)
    deadline = time.time() + 60
    while time.time() < deadline and "tab=components" not in page.url and len(page.context.pages) == pages:
        page.wait_for_timeout(200)                                  # Playwright's events are read while it waits
    opened = page if "tab=components" in page.url else page.context.pages[-1]
    assert "tab=components" in opened.url, opened.url
    opened.wait_for_selector("#components-run", state="attached", timeout=30_000)
    for plot in ("components-by-layer", "components-by-head", "components-pattern-row"):
        wait_plot(opened, plot)
    assert (field(opened, "components-prompt").input_value(), field(opened, "components-target").input_value(),
            field(opened, "components-position").input_value(), field(opened, "components-patterns").input_value()) \
        == (FRANCE, "Paris", str(last), "29")
    assert "logit(' Paris')" in opened.inner_text("#components-summary").replace("\\", "")
    shot(opened, "components-from-a-cell")
    assert not page.errors and not opened.errors


def test_hostile_input_gets_one_line(page, app_url):
    blind_event_urls(page)
    open_app(page, app_url, "v=1&tab=components&position=last&patterns=%3Cscript%3E&target=%00")
    notice = page.locator("#link-notice")
    notice.wait_for(state="visible", timeout=60_000)
    for word in ("position", "patterns", "target"):
        assert f"link's {word}" in notice.inner_text()
    wait_plot(page, "components-by-layer")                              # the defaults run
    field(page, "components-target").fill("")
    field(page, "components-position").fill("99")
    page.click("#components-run")
    toast = page.locator(".toast-body").first
    toast.wait_for(state="visible", timeout=RUN_TIMEOUT)
    said = [line for line in toast.inner_text().splitlines() if line.strip() not in ("", "Error", "×")]
    assert len(said) == 1 and "target is empty" in said[0], said          # past the title and close button: one line
    assert not page.errors and not page.dialogs

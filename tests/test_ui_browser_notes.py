"""In Chromium: skipping punctuation, a link's title and note, and each heatmap as a table (the session's app,
conftest's `app_url`, which waits for the engine; the helpers are test_ui_browser's)."""

from __future__ import annotations

from urllib.parse import quote

from test_ui_browser import blind_event_urls, cells, hover_cell, open_app, shot, wait_plot

SUPERSCRIPTS = "¹²³⁴⁵⁶⁷⁸⁹⁰"


def cell_texts(page, plot: str) -> list[str]:
    return page.eval_on_selector_all(f"#{plot} g.role-mark text", "els => els.map(e => e.textContent)")


def test_skipping_punctuation_changes_cells_and_the_hover_keeps_the_true_top_1(page, app_url):
    open_app(page, app_url, "tab=logit&prompt=The%20Eiffel%20Tower%20is%20in%20the%20city%20of&layers=12-29&k=3")
    wait_plot(page, "logit-heatmap")
    before = cells(page, "logit-heatmap")
    assert before and not any(ch in "".join(cell_texts(page, "logit-heatmap")) for ch in SUPERSCRIPTS)
    assert all("shown" not in c for c in before)
    page.locator("#logit-punct input").check()
    page.click("#logit-run")
    page.wait_for_function(f"() => [...document.querySelectorAll('#logit-heatmap g.role-mark text')]"
                           f".some(e => /[{SUPERSCRIPTS}]/.test(e.textContent))", timeout=90_000)
    after = cells(page, "logit-heatmap")
    assert len(after) == len(before)
    key = lambda c: (c["layer"], c["position"])  # noqa: E731
    true_top1 = {key(c): c["#1"] for c in before}
    assert all(true_top1[key(c)] == c["#1"] for c in after)                 # the tooltip keeps the true top-k
    moved = [i for i, c in enumerate(after) if "skipping punctuation: rank" in c["shown"]
             and "rank 1)" not in c["shown"]]
    assert moved, [c["shown"] for c in after][:10]
    tip = hover_cell(page, "logit-heatmap", moved[0])
    text = tip.inner_text()
    assert "skipping punctuation: rank" in text and after[moved[0]]["#1"].split()[0] in text
    page.wait_for_function("() => location.search.includes('punct=1')", timeout=30_000)
    shot(page, "skip-punctuation")
    assert not page.errors


def test_a_notes_link_shows_text_outlines_its_cells_and_has_a_table(page, app_url):
    note = "<script>window.pwned=1</script> Look at layer 29, `␣Paris`: <b>bold</b>?"
    blind_event_urls(page)
    open_app(page, app_url, "tab=logit&prompt=The%20capital%20of%20France%20is&layers=26-29&k=3"
                            f"&title={quote('<i>Where is Paris?</i>')}&note={quote(note)}")
    shown = page.locator("#link-note")
    shown.wait_for(state="visible", timeout=60_000)
    assert "<script>window.pwned=1</script>" in shown.inner_text() and "<i>Where is Paris?</i>" in shown.inner_text()
    assert page.evaluate("() => window.pwned") is None
    assert shown.locator("script, b, i").count() == 0
    assert page.locator("#link-note-text textarea").input_value() == note          # the box carries it on
    wait_plot(page, "logit-heatmap")
    outlined = page.eval_on_selector_all(
        "#logit-heatmap g.role-mark path[aria-roledescription='rect mark']",
        "els => els.filter(e => /layer_3_marks/.test(e.parentElement.getAttribute('class')))"
        ".map(e => e.getAttribute('aria-label'))")
    assert outlined and all("layer: 29" in label and "#1: ␣Paris" in label for label in outlined), outlined
    assert "note=" in page.url and "title=" in page.url
    page.get_by_text("Heatmap as a table").first.click()
    table = page.locator("#logit-grid-table table").first
    table.wait_for(state="visible", timeout=30_000)
    assert table.locator("tbody tr").count() == 4 and table.locator("th[scope=row]").first.inner_text() == "29"
    assert "␣Paris (p=" in table.inner_text()
    shot(page, "link-note")
    assert not page.errors and not page.dialogs

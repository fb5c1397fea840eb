"""A first visit in Chromium: the front page draws its example at once and visitors cost the engine nothing;
a phone reaches every control; a workshop's exercises open their views and are counted."""

from __future__ import annotations

import json
import urllib.request

from conftest import WORKSHOP
from test_serving import health, ready
from test_ui_browser import cells, field, n_tokens, open_app, open_tab, shot, wait_plot

from lensapp import workshop as workshops

# Each tab's chart, drawn on a visit without a link.
FRONT_PLOTS = {"Logit lens": "logit-heatmap", "Jacobian lens": "jacobian-heatmap", "Generation": "generate-heatmap",
               "Compare": "compare-heatmaps", "Intervene": "intervene-pair"}


def forwards(url: str) -> int:
    return sum(health(url)["forwards"].values())


def test_the_front_page_draws_its_example_and_visits_cost_no_forwards(page, app_url, model_dims, embedded_dir):
    ready(app_url)
    open_app(page, app_url)                                   # no click: the example is drawn on load
    wait_plot(page, "logit-heatmap")
    n_layers, n_pos = model_dims["num_hidden_layers"], n_tokens(embedded_dir, "The capital of France is")
    got = cells(page, "logit-heatmap")
    assert len(got) == n_layers * n_pos
    intro = page.locator("#logit-intro")
    assert "each row is a layer" in intro.inner_text()
    assert intro.bounding_box()["y"] < page.locator("#logit-heatmap").bounding_box()["y"]    # said above the chart
    for tab, plot in FRONT_PLOTS.items():                    # every tab opens on a drawn example
        page.get_by_role("tab", name=tab).first.click()
        wait_plot(page, plot)
    shot(page, "front-page")
    before = forwards(app_url)
    for _ in range(5):                                       # a visit that cost a forward would show in the first
        open_app(page, app_url)
        wait_plot(page, "logit-heatmap")
    page.get_by_role("tab", name="Intervene").first.click()  # the last tab's example: the whole load chain ran
    wait_plot(page, "intervene-pair")
    assert forwards(app_url) == before, health(app_url)["forwards"]
    assert health(app_url)["cache"]["pinned"] >= len(FRONT_PLOTS)
    assert not page.errors




def test_a_workshops_exercises_open_their_views_and_questions_and_are_counted(page, app_url):
    """The session app runs tests/data/workshop.yaml: three exercises on the logit, compare and Jacobian tabs."""
    plan = workshops.load(WORKSHOP)
    before = _workshop(app_url)["exercises"]
    open_app(page, app_url)
    buttons = page.locator("#exercises button[id^='exercise-']")
    assert buttons.count() == 3
    assert [b.strip() for b in buttons.all_inner_texts()] == [f"{i}. {ex.title}" for i, ex in
                                                              enumerate(plan.exercises, 1)]
    checks = [("Logit lens", "logit-heatmap", "logit-prompt", "Water boils at", (20, 29)),
              ("Compare", "compare-heatmaps", "compare-prompt2", "The capital of Italy is", (24, 29)),
              ("Jacobian lens", "jacobian-heatmap", "jacobian-prompt", "The Eiffel Tower is located in the city of",
               (16, 29))]
    for i, (ex, (tab, plot, box, prompt, layers)) in enumerate(zip(plan.exercises, checks), 1):
        page.locator(f"#exercise-{i}").click()
        page.wait_for_function(f"() => document.querySelector('#exercise-question')?.innerText.includes("
                               f"{ex.question!r})", timeout=30_000)
        assert page.get_by_role("tab", name=tab).first.get_attribute("aria-selected") == "true"
        page.wait_for_function(f"() => document.querySelector('#{box} textarea, #{box} input')?.value === "
                               f"{prompt!r}", timeout=30_000)
        wait_layers(page, plot, *layers)          # the exercise's own chart: the tab's example drew every layer
        assert page.locator("#exercise-hint").is_visible() == bool(ex.hint)
        assert field(page, box).input_value() == prompt
    shot(page, "workshop")
    after = _workshop(app_url)
    assert {k: after["exercises"][k] - before[k] for k in before} == {f"{i}. {ex.title}": 1
                                                                      for i, ex in enumerate(plan.exercises, 1)}
    assert after["tabs"].get("compare", 0) >= 1 and after["tabs"].get("jacobian", 0) >= 1
    assert "prompts" not in after and "Eiffel" not in str(after) and "Italy" not in str(after)   # never a prompt
    assert health(app_url)["workshop"]["exercises"] == after["exercises"]
    assert not page.errors


def wait_layers(page, plot: str, low: int, high: int) -> None:
    """Wait until the chart `plot` draws layers `low`..`high` and no other (a J lens's heatmap: those of them
    it has, the last among them)."""
    page.wait_for_function("""([plot, low, high]) => {
        const marks = document.querySelectorAll(`#${plot} g.role-mark path[aria-roledescription='rect mark']`);
        const layers = [...marks].map(e => /(?:^|; )layer: (\\d+)/.exec(e.getAttribute('aria-label') || ''))
            .filter(Boolean).map(m => Number(m[1]));
        return layers.length > 0 && layers.every(l => l >= low && l <= high) && layers.includes(high);
    }""", arg=[plot, low, high], timeout=120_000)


def _workshop(url: str) -> dict:
    with urllib.request.urlopen(url + "workshop", timeout=10) as r:
        return json.loads(r.read())


def test_a_phone_reaches_every_control(phone, app_url):
    """390 px wide: the page does not scroll sideways, each control of the logit tab lies within the width, every
    tab is reachable (Gradio folds the ones that do not fit into an overflow menu), and Tab reaches Run."""
    open_app(phone, app_url)
    wait_plot(phone, "logit-heatmap")
    width = phone.viewport_size["width"]
    assert phone.evaluate("() => document.documentElement.scrollWidth") <= width + 1
    for selector in ("#logit-prompt textarea", "#logit-targets textarea", "#logit-layers textarea",
                     "#logit-k input", "#logit-metric input", "#logit-run", "#copy-link", "#exercise-1"):
        control = phone.locator(selector).first
        control.scroll_into_view_if_needed()
        box = control.bounding_box()
        assert box is not None, selector
        assert box["x"] >= 0 and box["x"] + box["width"] <= width + 1, (selector, box)
    shot(phone, "phone")
    for tab in FRONT_PLOTS:
        open_tab(phone, tab)
    phone.get_by_role("tab", name="Logit lens").first.click()
    phone.locator("#logit-prompt textarea").focus()
    for _ in range(40):                                              # the keyboard alone reaches the button
        phone.keyboard.press("Tab")
        if phone.evaluate("() => document.activeElement?.id") == "logit-run":
            break
    assert phone.evaluate("() => document.activeElement?.id") == "logit-run"
    assert not phone.errors

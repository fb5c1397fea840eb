"""The first minute of a visit in Chromium, at 1400 and 390 px, on the tiny app (a Jacobian lens loaded, no
workshop): the page lands on both lenses and says where to look, only what applies is shown, a phone gets no
squeezed field and no tab scrolls sideways, Compare sits side by side (issue 37)."""

from __future__ import annotations

import traceback
from urllib.parse import quote

import pytest
from test_ui_browser import cells, open_tab, wait_plot
from tiny_app import served

from lensapp.config import Config
from lensapp.server import make_app

TABS = ("Logit lens", "Jacobian lens", "Generation", "Compare", "Intervene", "Components")
WIDTHS = {"desktop": (1400, 1000), "phone": (390, 844)}


@pytest.fixture(scope="module")
def tiny_url(tiny_service):
    with served(make_app(tiny_service, Config.of(rate_limit=0), warm=False)) as url:
        yield url


def visit(browser, url: str, width: str, query: str = ""):
    w, h = WIDTHS[width]
    context = browser.new_context(viewport={"width": w, "height": h}, is_mobile=width == "phone",
                                  has_touch=width == "phone")
    page = context.new_page()
    page.errors = []
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.goto(url + (f"?{query}" if query else ""))
    page.wait_for_selector("#tabs [role=tab]", timeout=60_000)
    return page


def svg_texts(page, plot: str) -> list[str]:
    return page.eval_on_selector_all(f"#{plot} svg text", "els => els.map(e => e.textContent)")


def test_the_page_lands_on_both_lenses_and_says_where_to_look(browser, tiny_url):
    page = visit(browser, tiny_url, "desktop")
    wait_plot(page, "jacobian-heatmap")
    assert page.get_by_role("tab", name="Jacobian lens").first.get_attribute("aria-selected") == "true"
    titles = " ".join(svg_texts(page, "jacobian-heatmap"))
    assert "Jacobian lens" in titles and "logit lens" in titles                   # both, side by side
    lede = page.inner_text("#header")
    assert "middle layers" in lede and "where they differ" in lede
    header, chart = page.locator("#header").bounding_box(), page.locator("#jacobian-heatmap").bounding_box()
    assert header["y"] < chart["y"] < 1000                                        # the picture is above the fold
    # a link opens exactly as before: its own tab
    linked = visit(browser, tiny_url, "desktop", f"v=1&tab=logit&prompt={quote('The capital of France is')}")
    wait_plot(linked, "logit-heatmap")
    assert linked.get_by_role("tab", name="Logit lens").first.get_attribute("aria-selected") == "true"
    assert not page.errors and not linked.errors
    page.context.close()
    linked.context.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_no_tab_scrolls_sideways_and_no_field_is_squeezed(browser, tiny_url, width):
    page = visit(browser, tiny_url, width)
    wait_plot(page, "jacobian-heatmap")
    inner = page.evaluate("innerWidth")
    for tab in TABS:
        open_tab(page, tab)
        page.wait_for_timeout(500)
        assert page.evaluate("document.scrollingElement.scrollWidth") <= inner, (width, tab)
        if width != "phone":
            continue
        # every field in view spans the phone's width (at least 3/4 of it): none gets a word a line
        widths = page.evaluate("""() => [...document.querySelectorAll('.tabitem')]
            .filter(t => t.offsetParent !== null)
            .flatMap(t => [...t.querySelectorAll('textarea, input[type=text], input[type=number], label')])
            .filter(e => e.offsetParent !== null && e.closest('.form'))
            .map(e => e.closest('.block'))
            .map(b => [b.id || b.className, Math.round(b.getBoundingClientRect().width)])""")
        assert widths, tab
        narrow = [(name, w) for name, w in widths if w < 0.75 * inner]
        assert not narrow, (tab, narrow)
    if width == "phone":
        open_tab(page, "Logit lens")
        assert page.locator("#logit-prompt").bounding_box()["width"] >= 0.75 * inner   # the prompt spans the width
    assert not page.errors
    page.context.close()


def test_intervene_shows_only_the_chosen_kinds_fields(browser, tiny_url):
    page = visit(browser, tiny_url, "desktop")
    open_tab(page, "Intervene")
    shown = {name: lambda n=name: page.locator(f"#intervene-{n}").is_visible()
             for name in ("word", "from", "source", "source-positions", "alphas", "direction", "ablation",
                          "objective")}
    page.wait_for_selector("#intervene-word", state="visible", timeout=30_000)
    assert shown["word"]() and shown["alphas"]() and shown["direction"]()
    assert not shown["source"]() and not shown["ablation"]() and not shown["objective"]()
    page.locator("#intervene-kind label", has_text="patch").click()
    page.wait_for_selector("#intervene-source", state="visible", timeout=30_000)
    assert shown["source-positions"]() and not shown["word"]() and not shown["alphas"]() and not shown["direction"]()
    page.locator("#intervene-kind label", has_text="ablate").click()
    page.wait_for_selector("#intervene-ablation", state="visible", timeout=30_000)
    assert shown["word"]() and not shown["alphas"]() and not shown["source"]()
    page.locator("#intervene-kind label", has_text="steer").click()
    page.locator("#intervene-direction label", has_text="fitted").click()
    page.wait_for_selector("#intervene-objective", state="visible", timeout=30_000)
    assert not page.errors
    page.context.close()


def test_a_generation_shows_no_branch_frames_before_a_branch(browser, tiny_url):
    page = visit(browser, tiny_url, "desktop")
    open_tab(page, "Generation")
    wait_plot(page, "generate-heatmap")
    assert page.locator("#branch-step").is_visible()                              # the next step is there
    for hidden in ("branch-heatmap", "branch-strip", "branch-divergence", "branch-shown", "branch-alternatives"):
        assert not page.locator(f"#{hidden}").is_visible(), hidden
    assert not page.errors
    page.context.close()


def test_compare_sits_side_by_side_on_a_wide_screen(browser, tiny_url):
    page = visit(browser, tiny_url, "desktop")
    open_tab(page, "Compare")
    wait_plot(page, "compare-heatmaps")
    tops = page.eval_on_selector_all(
        "#compare-heatmaps svg text", "els => els.filter(e => /^prompt [12]:/.test(e.textContent))"
                                      ".map(e => [e.textContent.slice(0, 8), Math.round(e.getBoundingClientRect().y),"
                                      " Math.round(e.getBoundingClientRect().right)])")
    assert len(tops) == 2 and abs(tops[0][1] - tops[1][1]) <= 2, tops             # one row, two pictures
    assert max(right for _, _, right in tops) <= 1400
    assert not page.errors
    page.context.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_a_long_link_draws_its_window_first_then_reads_the_whole_prompt(browser, tiny_url, tiny_service, width,
                                                                       monkeypatch):
    """The drawn window's readout first, then the whole prompt's (`lens_tab.complete`, on the state's change): at
    the end the window's slider and every position of the overview, and no page wider than a phone."""
    prompt = "one two three four five six seven eight nine ten " * 12
    n, lens, asked = len(tiny_service.prompts.ids(prompt)), tiny_service.lens, []

    def spy(req, *args, read_from=0, **kwargs):            # the page's own readouts (a link's prefetch reads too)
        if any(frame.name == "readout" for frame in traceback.extract_stack()):
            asked.append(read_from)
        return lens(req, *args, read_from=read_from, **kwargs)
    monkeypatch.setattr(tiny_service, "lens", spy)
    page = visit(browser, tiny_url, width, f"v=1&tab=logit&prompt={quote(prompt)}&k=3")
    wait_plot(page, "logit-heatmap")
    page.wait_for_selector("#logit-window", state="visible", timeout=60_000)
    assert asked == [n - 48, 0]                                          # the window, then the whole prompt
    assert len(cells(page, "logit-heatmap")) == 48 * tiny_service.info.n_layers
    assert f"all {n} positions" in " ".join(svg_texts(page, "logit-heatmap"))
    assert "Reading the rest" not in page.inner_text("#logit-summary")
    assert page.evaluate("document.scrollingElement.scrollWidth") <= page.evaluate("innerWidth")
    assert not page.errors
    page.context.close()

"""The app in a real browser: `python app.py` on the embedded model, driven by headless Chromium.

One app per session (conftest's `app_url`: starting vLLM on CPU takes about a minute; the API's hostile-input
test shares it), a fresh browser page per test.
Chromium is Debian's (`scripts/setup-test-deps.sh` installs it); Playwright drives it. Cells are
read from the chart's SVG: Vega gives every mark an aria-label built from its tooltip fields.
Screenshots of each tab land in artifacts/screenshots/ (git-ignored).
"""

from __future__ import annotations

import csv
import random
import re
import time
import urllib.parse

import pytest
from conftest import APP_LOG, J_LAYERS, REPO

SHOTS = REPO / "artifacts" / "screenshots"
HOSTILE = "<img src=x onerror=alert(1)>"
RUN_TIMEOUT = 90_000          # ms, one readout on a busy 2-core machine


# -- fixtures: app_url (the running app), browser and page are conftest's ------------------------


# -- helpers -------------------------------------------------------------------------------------

def open_app(page, url: str, query: str = "") -> None:
    page.goto(url + (f"?{query}" if query else ""))
    page.wait_for_selector("#logit-run", state="attached", timeout=30_000)


def blind_event_urls(page) -> None:
    """Strip the address-bar query Gradio copies onto every event request.

    The tabs' select on mount rewrites the address bar to the defaults, and a load event sent after
    that carries the rewritten query (it once won that race in CI). Stripping it on every request
    makes that lost race the rule: a restored link must come from the link the page opened with.
    """
    page.route(re.compile(r".*/gradio_api/(queue/join|run/predict)\?.*"),
               lambda route: route.continue_(url=route.request.url.split("?")[0]))


def cells(page, plot: str, chart: int = 0) -> list[dict]:
    """The heatmap's cells (rect marks) as dicts parsed from their aria-labels."""
    marks = f"#{plot} g.role-mark path[aria-roledescription='rect mark']"
    labels = page.eval_on_selector_all(marks, "els => els.map(e => e.getAttribute('aria-label'))")
    # concatenated charts: one group of cells per sub-chart, told apart by the mark group's class
    groups = page.eval_on_selector_all(marks, "els => els.map(e => e.parentElement.getAttribute('class'))")
    names = sorted({g for g in groups if "layer_0_marks" in g})
    wanted = names[chart] if names else None
    out = []
    for label, group in zip(labels, groups):
        if group != wanted or not label:
            continue
        out.append(dict(part.split(": ", 1) for part in label.split("; ") if ": " in part))
    return out


def hover_cell(page, plot: str, index: int, timeout: float = 30):
    """Move the mouse into a cell's corner (its centre is under the text mark, which has the same tooltip) until
    its tooltip shows; the tooltip. A chart drawn again under a still mouse (an answer landing after the hover)
    leaves it over a cell that is gone, so the mouse moves off and on again."""
    tip = page.locator("#vg-tooltip-element")
    deadline = time.monotonic() + timeout
    while True:
        page.mouse.move(0, 0)
        cell = page.locator(f"#{plot} path[aria-roledescription='rect mark']").nth(index)
        cell.hover(position={"x": 3, "y": 3}, force=True)
        try:
            tip.wait_for(state="visible", timeout=3_000)
            return tip
        except playwright_errors().TimeoutError:
            if time.monotonic() > deadline:
                raise


def wait_plot(page, plot: str) -> None:
    try:
        page.wait_for_selector(f"#{plot} svg.marks g.role-mark path", timeout=RUN_TIMEOUT)
    except playwright_errors().TimeoutError:
        toasts = page.locator(".toast-body").all_inner_texts()
        log = APP_LOG[0].read_text()[-3000:] if APP_LOG else ""
        try:
            shot(page, f"no-chart-{plot}")
        except Exception:  # noqa: BLE001 - a page too broken for a screenshot still has its calls to report
            pass
        pytest.fail(f"no chart in #{plot} after {RUN_TIMEOUT / 1000:.0f} s at {page.url}\n"
                    f"toasts: {toasts}\npage errors: {getattr(page, 'errors', [])}\n"
                    f"the chart on the page: {plot_state(page, plot)}\n"
                    "the page's calls:\n" + "\n".join(getattr(page, "events", [])) + f"\napp log:\n{log}")


def plot_state(page, plot: str) -> dict:
    """What the page shows where a chart was awaited: the tab in view, the plot's box and its marks."""
    try:
        return page.evaluate(PLOT_STATE, plot)
    except Exception as e:  # noqa: BLE001 - the report of a failure must not fail
        return {"error": str(e)}


PLOT_STATE = """id => {
        const el = document.getElementById(id), box = el && el.getBoundingClientRect();
        const tab = [...document.querySelectorAll('[role=tab][aria-selected=true]')].map(t => t.innerText.trim());
        return {tab, found: !!el, box: box && [box.width, box.height], svg: el ? el.querySelectorAll('svg').length : 0,
                marks: el ? el.querySelectorAll('g.role-mark path').length : 0,
                hidden: el ? getComputedStyle(el).visibility + '/' + getComputedStyle(el).display : null,
                pending: el ? el.querySelectorAll('.pending, .wrap.default').length : 0,
                first_mark: el && el.querySelector('g.role-mark path') &&
                    JSON.stringify(el.querySelector('g.role-mark path').getBoundingClientRect())};
    }"""


def open_tab(page, name: str) -> None:
    """A tab by its name, from the overflow menu where a phone folds it."""
    button = page.get_by_role("tab", name=name).first
    if not button.is_visible():
        page.locator(".overflow-dropdown button, .overflow-menu button").first.click()
        button = page.locator(".overflow-dropdown button", has_text=name).first
    button.click()
    page.wait_for_function(f"() => [...document.querySelectorAll('[role=tab]')].some(t => t.innerText.trim() === "
                           f"{name!r} && t.getAttribute('aria-selected') === 'true')", timeout=30_000)


def playwright_errors():
    import playwright.sync_api

    return playwright.sync_api


def shot(page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def field(page, elem_id: str):
    return page.locator(f"#{elem_id} textarea, #{elem_id} input").first


def n_tokens(embedded_dir, text: str) -> int:
    from transformers import AutoTokenizer

    return len(AutoTokenizer.from_pretrained(embedded_dir)(text)["input_ids"])


# -- tests ---------------------------------------------------------------------------------------

def test_page_loads(page, app_url):
    open_app(page, app_url)
    assert page.title() == "Test workshop · Lens Explorer"                # the app runs tests/data/workshop.yaml
    assert "SmolLM2-135M-Instruct" in page.inner_text("#header")
    for name in ("Logit lens", "Jacobian lens", "Generation"):
        assert page.get_by_role("tab", name=name).count() == 1
    assert page.get_by_role("tab", name="Logit lens").get_attribute("aria-selected") == "true"
    assert not page.errors



def test_a_page_opened_while_the_model_serves_says_nothing_of_its_loading(page, app_url):
    """The status line comes with the page's first answer. The page's own was built with the app, while the model
    loaded, and said "The model is loading" to every visitor until the first poll, 2 s in (and the page moved up
    when it went)."""
    page.add_init_script("""
      window.lensBanner = [];
      const look = () => {
        const line = document.querySelector('#engine-status');
        if (line && line.offsetParent !== null && line.innerText.trim()) { window.lensBanner.push(line.innerText); }
        requestAnimationFrame(look);
      };
      requestAnimationFrame(look);
    """)
    open_app(page, app_url)
    wait_plot(page, "logit-heatmap")                  # the workshop's first tab, its example
    page.wait_for_timeout(2_500)                      # past the first poll
    assert page.evaluate("window.lensBanner") == []
    assert not page.errors

def test_example_draws_heatmap_with_tooltips(page, app_url, model_dims, embedded_dir):
    open_app(page, app_url)
    page.get_by_text("The capital of France is → Paris").first.click()
    wait_plot(page, "logit-heatmap")
    got = cells(page, "logit-heatmap")
    n_layers, n_pos = model_dims["num_hidden_layers"], n_tokens(embedded_dir, "The capital of France is")
    assert len(got) == n_layers * n_pos
    assert {int(c["layer"]) for c in got} == set(range(n_layers))             # one row per layer
    assert {int(c["position"]) for c in got} == set(range(n_pos))              # one column per token
    assert page.locator("#logit-heatmap .vega-embed.has-actions").count() == 1  # the chart's export menu
    # the top layer at the last position is the model's own answer, with its top-k
    top = next(c for c in got if int(c["layer"]) == n_layers - 1 and int(c["position"]) == n_pos - 1)
    assert top["#1"].startswith("␣Paris") and "#5" in top
    # hovering a cell shows the same top-k in the tooltip
    tip = hover_cell(page, "logit-heatmap", -1)
    assert "#1" in tip.inner_text() and "%" in tip.inner_text()
    # token table: one row per layer; target curve drawn; the address bar holds the view
    # (the table is virtualised: only rows in view are in the DOM; the grid's aria-rowcount counts them all)
    assert page.get_attribute("#logit-table [role=grid]", "aria-rowcount") == str(n_layers + 1)
    assert "KL to final" in page.inner_text("#logit-table")
    assert "tab=logit" in page.url and "prompt=The%20capital" in page.url
    page.mouse.move(0, 0)
    shot(page, "logit")
    # CSV export: one row per lens x layer x position x rank
    with page.expect_download() as download:
        page.get_by_role("button", name="Download CSV").first.click()
    with open(download.value.path(), newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))                     # (tokens may hold newlines: quoted fields)
    assert rows[0][:10] == "lens,layer,position,input_token,rank,token_id,token,prob,entropy,kl_to_final".split(",")
    assert rows[0][10:] == ["decided_at", "decided_at_top5", "decided_at_p50"]      # the strip's, per position
    assert len(rows) == 1 + n_layers * n_pos * 5
    # editing an input rewrites the address bar
    field(page, "logit-k").fill("7")
    field(page, "logit-k").press("Tab")
    page.wait_for_function("() => location.search.includes('k=7')", timeout=30_000)
    assert not page.errors and not page.dialogs


def test_permalink_restores_view_and_runs(page, app_url):
    query = ("v=1&tab=jacobian&prompt=Water%20boils%20at&layers=20-29&k=3&targets=100&metric=kl&chat=0")
    blind_event_urls(page)
    open_app(page, app_url, query)
    wait_plot(page, "jacobian-heatmap")
    assert page.get_by_role("tab", name="Jacobian lens").get_attribute("aria-selected") == "true"
    assert field(page, "jacobian-prompt").input_value() == "Water boils at"
    assert field(page, "jacobian-layers").input_value() == "20-29"
    assert field(page, "jacobian-k").input_value() == "3"
    for chart in (0, 1):                                       # J-lens and logit lens over the same cells
        got = cells(page, "jacobian-heatmap", chart)
        assert {int(c["layer"]) for c in got} == {20, 24, 28, 29}
        assert "#3" in got[0] and "#4" not in got[0]
    wait_plot(page, "jacobian-diff")
    assert "Jacobian lens" in page.inner_text("#jacobian-table")
    assert not page.locator("#link-notice").is_visible()
    page.get_by_text("Lens provenance").click()
    assert "random test lens" in page.inner_text("#jlens-provenance")
    # the test lens names another model in its provenance: the tab says so
    assert "fitted on 'a random test model'" in page.inner_text(".lens-warning")
    shot(page, "jacobian")
    assert not page.errors


def test_generation_one_column_per_token(page, app_url):
    from gradio_client import Client

    open_app(page, app_url, "tab=generate&prompt=The%20capital%20of%20France%20is&max_tokens=6&layers=20-29")
    wait_plot(page, "generate-heatmap")
    got = cells(page, "generate-heatmap")
    expected = Client(app_url, verbose=False).predict("The capital of France is", 6, "logit", "20-29", 5, 0.0,
                                                      api_name="/generate")
    assert {int(c["step"]) for c in got} == set(range(len(expected["tokens"])))
    assert {int(c["layer"]) for c in got} == set(range(20, 30))
    assert page.locator("#generate-text textarea").input_value() == expected["text"]
    shot(page, "generate")
    assert not page.errors


def test_chat_reply_carries_a_readout(page, app_url):
    open_app(page, app_url)
    page.get_by_role("tab", name="Generation").click()
    page.get_by_role("tab", name="Chat").click()
    field(page, "chat-message").fill("What is the capital of Japan?")
    field(page, "chat-message").press("Enter")
    page.get_by_text(re.compile(r"J-lens at layer \d+: its top-1 under each token")).wait_for(timeout=RUN_TIMEOUT)
    cells = page.locator("#chat .lens-readout details.lens-tok")
    cells.first.wait_for(state="visible", timeout=30_000)             # each generated token over its top-1 ...
    page.wait_for_function("() => document.querySelectorAll('#chat .lens-readout details.lens-tok').length >= 2",
                           timeout=30_000)                            # ... written as the reply is (it streams)
    # the reply done (its box offers Send again): a tap mid-stream is redrawn shut by the next step's readout
    page.wait_for_function("() => !document.querySelector('#chat-message [data-testid=stop-button]')"
                           " && !!document.querySelector('#chat-message [data-testid=submit-button]')",
                           timeout=RUN_TIMEOUT)
    assert "%" in cells.first.get_attribute("title")                    # the top-3 on hover ...
    cells.first.locator("summary").click()                              # ... and on tap
    assert "%" in cells.first.locator(".topk").inner_text()
    shot(page, "chat")
    assert not page.errors


def test_hostile_prompt_is_text(page, app_url):
    open_app(page, app_url)
    field(page, "logit-prompt").fill(HOSTILE)
    field(page, "logit-targets").fill(HOSTILE)
    wait_plot(page, "logit-heatmap")                                   # the front page's example first ...
    page.click("#logit-run")
    page.wait_for_function("() => [...document.querySelectorAll('#logit-heatmap g.role-axis-label text')]"
                           ".some(e => e.textContent.includes('img'))", timeout=RUN_TIMEOUT)    # ... then this one
    hover_cell(page, "logit-heatmap", 0)                               # its tooltip shows
    page.wait_for_selector("#logit-summary p")
    labels = page.eval_on_selector_all("#logit-heatmap g.role-axis-label text", "els => els.map(e => e.textContent)")
    assert HOSTILE in "".join(labels).replace("␣", " ").replace("\u200b", "")   # the tokens, drawn as text
    assert "<img" in page.inner_text("#logit-summary")                 # the target, as text
    assert page.locator("img[src='x']").count() == 0                   # ... and never as an element
    assert page.locator("#vg-tooltip-element img").count() == 0
    assert page.evaluate("() => document.querySelectorAll('[onerror]').length") == 0
    assert not page.dialogs and not page.errors


def test_hostile_permalink_shows_notice(page, app_url):
    blind_event_urls(page)
    open_app(page, app_url, "tab=admin&k=-3&prompt=%FF%FE&layers=0-999&metric=%3Cscript%3E")
    notice = page.locator("#link-notice")
    notice.wait_for(state="visible", timeout=60_000)
    text = notice.inner_text()
    for word in ("tab", "k", "prompt", "layers", "metric"):
        assert f"link's {word}" in text
    assert page.get_by_role("tab", name="Logit lens").get_attribute("aria-selected") == "true"
    assert field(page, "logit-prompt").input_value() == "The capital of France is"
    wait_plot(page, "logit-heatmap")                                   # and the defaults still run
    shot(page, "hostile-link")
    assert not page.errors and not page.dialogs


def test_api_endpoints(app_url):
    from gradio_client import Client

    client = Client(app_url, verbose=False)
    out = client.predict("The capital of France is", "both", "all", 5, "Paris", api_name="/lens")
    assert isinstance(out, dict) and out["layers"] == J_LAYERS + [29]
    assert set(out["lenses"]) == {"logit", "jacobian"} and out["jlens"]["layers"] == J_LAYERS
    assert out["lenses"]["logit"]["targets"][0]["text"] == "Paris"
    gen = client.predict("The capital of France is", 4, "logit", "all", 3, 0.0, api_name="/generate")
    assert isinstance(gen, dict) and len(gen["steps"]) == len(gen["tokens"]) <= 4
    with pytest.raises(Exception, match="outside this 30-layer model"):
        client.predict("The capital of France is", "logit", "99", 5, "", api_name="/lens")


def test_app_without_a_jlens_says_how_to_load_one():
    """No model needed: build the Blocks over a stand-in service that has no Jacobian lens."""
    from types import SimpleNamespace

    import gradio as gr

    from lensapp import ui
    from lensapp.config import LimitSettings, WebSettings
    from lensapp.engine import ModelInfo

    service = SimpleNamespace(info=ModelInfo("stand-in", 4, 8, 100, "none", "cpu", "float32"), jlens=None,
                              jlens_layers=[], jlens_error=None, chat_layers=lambda lens: [0, 1, 2, 3],
                              model=SimpleNamespace(path="stand-in", family=None),
                              prompts=None,             # no tokenizer: a link's positions are read as written
                              health=lambda: {"state": "ready"},
                              status=lambda: {"state": "ready", "reason": "", "queue_depth": 0})
    demo = ui.build_app(service, WebSettings(), LimitSettings())
    texts = [b.value for b in demo.blocks.values() if isinstance(b, gr.Markdown) and isinstance(b.value, str)]
    assert any("No Jacobian lens is loaded" in t and "--jlens" in t for t in texts)
    radios = [b for b in demo.blocks.values() if isinstance(b, gr.Radio) and (b.elem_id or "").endswith("-lens")]
    assert len(radios) >= 3 and all(value == "logit" for r in radios for _, value in r.choices)   # logit only
    # A generation link that reads the J-lens opens on the logit lens, with a notice, not a broken Radio.
    restore = next(f.fn for f in demo.fns.values() if getattr(f.fn, "__name__", "") == "restore")
    out = {getattr(c, "elem_id", None): v for c, v in restore("?tab=generate&lens=jacobian&prompt=Hi").items()}
    assert out["generate-lens"] == "logit" and out["generate-prompt"] == "Hi"
    assert "no Jacobian lens" in out["link-notice"].value and out["link-notice"].visible


def test_compare_link_draws_both_prompts_aligned_without_padding(page, app_url, embedded_dir):
    a, b = "Paris is in", "The Eiffel Tower is located in the city of"
    blind_event_urls(page)
    open_app(page, app_url, f"v=1&tab=compare&prompt1={a.replace(' ', '%20')}&prompt2={b.replace(' ', '%20')}"
                            "&layers=26-29&k=3&targets=Paris,France")
    wait_plot(page, "compare-heatmaps")
    assert page.get_by_role("tab", name="Compare").get_attribute("aria-selected") == "true"
    first, second = cells(page, "compare-heatmaps", 0), cells(page, "compare-heatmaps", 1)
    n_a, n_b = n_tokens(embedded_dir, a), n_tokens(embedded_dir, b)
    assert n_a < n_b
    assert len(first) == 4 * n_a and len(second) == 4 * n_b             # a cell per token: none for padding
    assert {int(c["position"]) for c in first} == set(range(n_a))
    assert page.locator("#compare-heatmaps g.role-legend").count() == 1 # one colour scale
    page.wait_for_selector("#compare-targets-plot svg.marks", timeout=30_000)
    legend = " ".join(page.eval_on_selector_all("#compare-targets-plot g.role-legend-label text",
                                                "els => els.map(e => e.textContent)"))
    assert "1: Paris" in legend and "2: Paris" in legend                 # both prompts' trajectories
    summary = page.inner_text("#compare-summary")
    assert any(where in summary for where in ("part ways at layer", "agree at the top", "differ from the first"))
    assert "prompt 2: ␣Paris" in summary                                 # what each prompt ends on
    assert page.get_attribute("#compare-table [role=grid]", "aria-rowcount") == str(4 + 1)
    shot(page, "compare")
    assert not page.errors


@pytest.mark.extended
def test_generation_link_restores_its_seed(page, app_url):
    from gradio_client import Client

    blind_event_urls(page)
    open_app(page, app_url, "tab=generate&prompt=Once%20upon%20a%20time&max_tokens=6&temperature=0.8&seed=7"
                            "&layers=28-29")
    wait_plot(page, "generate-heatmap")
    assert field(page, "generate-seed").input_value() == "7"
    expected = Client(app_url, verbose=False).predict("Once upon a time", 6, "logit", "28-29", 5, 0.8, 7,
                                                      api_name="/generate")
    assert page.locator("#generate-text textarea").input_value() == expected["text"]
    assert "seed=7" in page.url
    assert not page.errors


@pytest.mark.extended
def test_a_long_prompt_shows_a_window_and_the_code(page, app_url, embedded_dir):
    prompt = "one two three four five six seven eight nine ten " * 12
    n = n_tokens(embedded_dir, prompt)
    assert n > 60
    blind_event_urls(page)
    open_app(page, app_url, f"tab=logit&prompt={prompt.replace(' ', '%20')}&layers=27-29&k=3")
    wait_plot(page, "logit-heatmap")
    drawn = cells(page, "logit-heatmap")
    assert len(drawn) == 3 * 48 and {int(c["position"]) for c in drawn} == set(range(n - 48, n))   # the last 48
    # drawn from its window's readout first (`lens_tab.readout`); the slider comes with the whole prompt's
    page.wait_for_selector("#logit-window", state="visible", timeout=120_000)   # the slider that moves the window
    assert "Reading the rest" not in page.locator("#logit-summary").inner_text()
    assert len(cells(page, "logit-heatmap")) == 3 * 48
    page.get_by_text("Show the code").click()
    page.wait_for_function("() => document.querySelector('#logit-code')?.innerText.includes('TransformersModel')",
                           timeout=30_000)
    shot(page, "long-prompt")
    assert not page.errors



def test_a_heavy_links_page_is_quiet_once_it_is_read_whole(page, app_url):
    """A long link's first look is its window, then the rest (`lens_tab.complete`); after that the page sends
    nothing. On a 290-word link at k 100 over every layer its complete and show_code once fired every ~0.6 s for as
    long as it stayed open (8 loads in 9): complete was started by a change of the state it writes, and Gradio's
    JSON sent that change again after its answers."""
    words = random.Random(7).choices(["harbour", "stone", "window", "river", "school", "morning", "city"], k=290)
    joins = []
    page.on("request", lambda r: joins.append(r.url) if "/queue/join" in r.url else None)
    open_app(page, app_url, urllib.parse.urlencode({"v": 2, "tab": "logit", "prompt": "He wrote: " + " ".join(words),
                                                    "layers": "all", "k": 100}))
    page.wait_for_selector("#logit-window", state="visible", timeout=180_000)    # the slider: read whole
    deadline, settled, quiet_since = time.monotonic() + 60, len(joins), time.monotonic()
    while time.monotonic() - quiet_since < 3 and time.monotonic() < deadline:   # its code, the landing's last
        page.wait_for_timeout(250)                                               # steps: 3 s without a join
        if len(joins) != settled:
            settled, quiet_since = len(joins), time.monotonic()
    page.wait_for_timeout(5_000)
    assert len(joins) == settled, joins[settled:]
    assert not page.errors


STEER_LINK = ("v=1&tab=intervene&prompt=The%20capital%20of%20France%20is&intervention=steer&word=Rome&layer=22"
              "&alphas=0%2C0.2%2C0.4&layers=18-29&k=3")
PATCH_LINK = ("v=1&tab=intervene&prompt=The%20Colosseum%20is%20in%20the%20city%20of&intervention=patch"
              "&source=The%20Eiffel%20Tower%20is%20in%20the%20city%20of&layer=8-10&positions=1-3"
              "&source_positions=1-3&targets=Paris&layers=6-29")


def test_a_steer_link_restores_runs_once_and_draws_before_after_and_difference(page, app_url):
    blind_event_urls(page)
    open_app(page, app_url, STEER_LINK)
    wait_plot(page, "intervene-pair")
    assert page.get_by_role("tab", name="Intervene").get_attribute("aria-selected") == "true"
    assert (field(page, "intervene-word").input_value(), field(page, "intervene-layer").input_value(),
            field(page, "intervene-alphas").input_value()) == ("Rome", "22", "0, 0.2, 0.4")
    before, after = cells(page, "intervene-pair", 0), cells(page, "intervene-pair", 1)
    assert {int(c["layer"]) for c in before} == set(range(18, 30)) == {int(c["layer"]) for c in after}
    top = max(int(c["layer"]) for c in after)
    last = [c for c in after if int(c["layer"]) == top][-1]
    assert last["#1"].split()[0] == "␣Rome"                      # after alpha 0.4 the model says Rome
    wait_plot(page, "intervene-diff")
    wait_plot(page, "intervene-dose")
    assert "Typical residual norm" in page.inner_text("#intervene-summary")
    assert page.locator("#intervene-change").is_visible()
    shot(page, "intervene-steer")
    assert not page.errors and not page.dialogs


def test_a_patch_link_restores_runs_once_and_draws_before_after_and_difference(page, app_url):
    blind_event_urls(page)
    open_app(page, app_url, PATCH_LINK)
    wait_plot(page, "intervene-pair")
    assert field(page, "intervene-source").input_value() == "The Eiffel Tower is in the city of"
    assert page.get_by_role("radio", name="patch").is_checked()
    wait_plot(page, "intervene-diff")
    assert "Copied from" in page.inner_text("#intervene-summary")
    assert "layer 8" in page.inner_text("#intervene-summary") or page.locator("#intervene-change").is_visible()
    assert page.locator("#intervene-source-table").count() == 1
    shot(page, "intervene-patch")
    assert not page.errors and not page.dialogs


def host_health(url: str) -> dict:
    import json
    import urllib.request

    with urllib.request.urlopen(url + "health", timeout=30) as r:      # loopback: the host's view
        return json.loads(r.read())


def cache_counts(url: str) -> dict:
    cache = host_health(url)["cache"]
    return {"computed": cache["misses"], "found": cache["hits"] + cache["shared_in_flight"]}


def until_idle(url: str, timeout: float = 120) -> None:
    """The engine idle on two looks half a second apart (a link's GET prefetches only into an idle engine): the
    tests before may have left work in it."""
    deadline, idle_looks = time.monotonic() + timeout, 0
    while idle_looks < 2 and time.monotonic() < deadline:
        h = host_health(url)
        idle_looks = idle_looks + 1 if not h["admitted"] and not h["in_flight"] else 0
        time.sleep(0.5)


@pytest.mark.parametrize("tab, chart", [("generate", "generate-heatmap"), ("compare", "compare-heatmaps"),
                                        ("intervene", "intervene-pair"), ("components", "components-by-layer")])
def test_a_links_page_finds_the_readout_its_get_started(page, app_url, tab, chart):
    """A link's GET starts its readout (`ui/prefetch.py`); the page's own request, built from its inputs as the page
    restored them, is that same request: it finds it in the result cache, done or in flight, and the engine reads
    the link once: the page's visit computes what the same request through the API computes, not twice that. An
    intervention's link reads its picture's part first besides (`intervene_tab.first_read`: the readout before
    and the sweep's last alpha), which the API then finds too."""
    from gradio_client import Client

    from lensapp.service import fields
    from lensapp.ui import permalinks
    from lensapp.ui.views import TAB_VIEWS, View

    def view(n: int) -> View:
        prompt = f"On day {n} of the trip, the capital of France is"
        if tab == "compare":
            return View(tab=tab, prompts=(prompt, prompt.replace("France", "Italy")))
        return View(tab=tab, prompt=prompt)

    day = random.randrange(10_000)
    until_idle(app_url)
    before = cache_counts(app_url)
    open_app(page, app_url, permalinks.query_string(view(day)))
    wait_plot(page, chart)
    page.wait_for_timeout(1_500)                                      # the link's last steps
    until_idle(app_url)
    visit = cache_counts(app_url)
    tab_view = TAB_VIEWS[tab]
    values = tab_view.values_of(view(day + 1))
    client = Client(app_url, verbose=False)

    def ask(values: dict) -> dict:
        raw = {field.name: tab_view.read(name, values) for name, field in tab_view.request_fields().items()}
        client.predict(**{k: list(v) if isinstance(v, tuple) else v for k, v in raw.items()},
                       api_name=f"/{tab_view.kind}")
        return cache_counts(app_url)

    api = ask(values)
    part = 1 if tab == "intervene" else 0
    assert visit["found"] > before["found"]                           # the page found what its GET started
    assert visit["computed"] - before["computed"] == api["computed"] - visit["computed"] + part, (before, visit, api)
    assert api["computed"] > visit["computed"]
    if part:                                                          # the part the link read first, found
        shown = ask({**tab_view.values_of(view(day)), "alphas": str(fields.DEFAULT_ALPHAS[-1]), "new_tokens": 0})
        assert shown["computed"] == api["computed"] and shown["found"] == api["found"] + 1, (api, shown)
    assert not page.errors

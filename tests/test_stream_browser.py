"""The Generation tab and the chat written as the model writes, in Chromium, on the tiny app (its model slowed to
a readable pace): the text grows and the heatmap is drawn before the generation ends, at 1400 and 390 px; Stop
ends the generation where it is, keeps what was written, and frees the engine."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest
from tiny_app import served

from lensapp import config

pytestmark = pytest.mark.browser

RUN_TIMEOUT = 120_000        # ms
STEP_SECONDS = 0.15          # the tiny model slowed to this a step: a page can see it write
# Every value the generated text shows, recorded as it changes, and whether a heatmap was drawn by then since the
# record began (Vega draws each chart in a new SVG; the one on the page before is marked old).
RECORD = """() => {
  window.__texts = []; window.__drawn = [];
  document.querySelectorAll('#generate-heatmap svg.marks').forEach((svg) => { svg.dataset.old = '1'; });
  const box = () => document.querySelector('#generate-text textarea');
  setInterval(() => {
    const b = box(); if (!b) return;
    const texts = window.__texts;
    if (!texts.length || texts[texts.length - 1] !== b.value) {
      texts.push(b.value);
      window.__drawn.push(!!document.querySelector('#generate-heatmap svg.marks:not([data-old])'));
    }
  }, 20);
}"""


@pytest.fixture(scope="module")
def tiny_url(tiny_service):
    from lensapp.server import make_app

    with served(make_app(tiny_service, config.Config.of(rate_limit=0, cache_entries=0))) as url:
        yield url


@pytest.fixture
def slow_model(monkeypatch):
    from lensapp.engine.run import hf_backend

    body = hf_backend.lens_body

    def slow(*args, **kwargs):
        time.sleep(STEP_SECONDS)
        return body(*args, **kwargs)
    monkeypatch.setattr(hf_backend, "lens_body", slow)


def health(url: str) -> dict:
    with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=30) as r:
        return json.loads(r.read())


def settled(url: str, timeout: float = 60) -> None:
    """Wait until the page's own first readouts (the front page's examples: computed, as the result cache is off)
    are done: one that lands after a click writes its example over the visitor's result, and the engine is not
    free for a count of what one generation does."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        h = health(url)
        if not h["admitted"] and not h["in_flight"]:
            return
        time.sleep(0.2)
    raise AssertionError(f"the page's first readouts did not end in {timeout} s")


def quiet_texts(pg, quiet: float = 1.5, timeout: float = 60) -> list[str]:
    """The texts recorded once the page has written nothing new for `quiet` seconds."""
    deadline = time.monotonic() + timeout
    seen, since = None, time.monotonic()
    while time.monotonic() < deadline:
        count = pg.evaluate("window.__texts.length")
        if count != seen:
            seen, since = count, time.monotonic()
        elif time.monotonic() - since >= quiet:
            break
        time.sleep(0.1)
    return pg.evaluate("window.__texts")


def generate(pg, url: str, tokens: int) -> tuple[str, int]:
    """Generate `tokens` tokens on the Generation tab, recording its text as it changes; what it showed before,
    and the engine's count of served calls just before the click."""
    pg.goto(url)
    pg.locator("[role=tab]").first.wait_for(timeout=RUN_TIMEOUT)
    settled(url)
    button = pg.get_by_role("tab", name="Generation").first
    if not button.count() or not button.is_visible():        # a phone folds the tabs into a menu
        pg.locator(".overflow-dropdown button, .overflow-menu button").first.click()
        button = pg.locator(".overflow-dropdown button", has_text="Generation").first
    button.click()
    pg.locator("#generate-prompt textarea").fill("Once upon a time", timeout=RUN_TIMEOUT)
    tokens_box = pg.locator("#generate-max-tokens input[type=number]")
    tokens_box.fill(str(tokens))
    tokens_box.press("Enter")
    # the tab's example, drawn as the page opened (its step comes after the landing tab's: wait for it, or it lands
    # over the generation asked here)
    pg.wait_for_function("() => document.querySelector('#generate-text textarea')?.value", timeout=RUN_TIMEOUT)
    before = pg.locator("#generate-text textarea").input_value()
    pg.evaluate(RECORD)
    served = health(url)["calls"]["served"]
    pg.locator("#generate-run").click()
    return before, served


@pytest.mark.parametrize("width", [1400, 390])
def test_the_text_grows_and_the_heatmap_is_drawn_while_the_model_writes(browser, tiny_url, slow_model, width):
    pg = browser.new_context(viewport={"width": width, "height": 900}).new_page()
    errors, encodings = [], set()
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.on("response", lambda r: "queue/data" in r.url and encodings.add(r.headers.get("content-encoding")))
    before, served = generate(pg, tiny_url, 24)
    # the engine served this generation (waiting on `admitted` alone could read before it was admitted), then the
    # page wrote its last step
    deadline = time.monotonic() + 60
    while health(tiny_url)["calls"]["served"] == served and time.monotonic() < deadline:
        time.sleep(0.2)
    texts = quiet_texts(pg)
    drawn = pg.evaluate("window.__drawn")
    while texts and texts[0] in ("", before):
        texts, drawn = texts[1:], drawn[1:]
    assert len(texts) >= 4, texts                                  # written in several redraws, not once
    rewritten = [(a[-40:], b[-60:]) for a, b in zip(texts, texts[1:]) if not b.startswith(a)]
    assert not rewritten, rewritten                                # each redraw extends the one before
    assert any(drawn[:-1]), "the heatmap was drawn only at the end"
    assert pg.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1"), "scrolls sideways"
    assert not errors
    assert encodings == {"gzip"}                                   # written compressed, and still as it comes


def test_stop_keeps_what_was_written_and_frees_the_engine(browser, tiny_url, slow_model):
    pg = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
    before = health(tiny_url)["calls"]
    generate(pg, tiny_url, 64)
    pg.wait_for_function("() => window.__texts.filter(t => t).length >= 3", timeout=RUN_TIMEOUT)
    pg.locator("#generate-stop").click()
    deadline = time.monotonic() + 30
    while health(tiny_url)["calls"]["cancelled"] == before["cancelled"] and time.monotonic() < deadline:
        time.sleep(0.1)
    now = health(tiny_url)
    assert now["calls"]["cancelled"] == before["cancelled"] + 1 and now["in_flight"] == 0, now
    time.sleep(1.5)
    kept = pg.locator("#generate-text textarea").input_value()
    assert kept and kept == pg.evaluate("window.__texts[window.__texts.length - 1]")
    assert len(pg.evaluate("window.__texts")) < 40                  # it stopped well before 64 tokens
    pg.locator("#generate-step").click()                            # the steps written can be picked
    assert pg.locator("#generate-heatmap svg.marks").count()


def test_a_chat_reply_and_its_readout_grow_as_the_model_writes(browser, tiny_url, slow_model):
    pg = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
    pg.goto(tiny_url)
    pg.locator("[role=tab]").first.wait_for(timeout=RUN_TIMEOUT)
    settled(tiny_url)
    pg.get_by_role("tab", name="Generation").first.click()
    pg.get_by_role("tab", name="Chat").first.click()
    pg.evaluate("""() => {
      window.__cells = []; window.__buttons = [];
      setInterval(() => {
        const n = document.querySelectorAll('#chat .lens-readout .lens-tok').length, c = window.__cells;
        if (!c.length || c[c.length - 1] !== n) c.push(n);
        const b = [...document.querySelectorAll('#chat-message button')].map(e => e.dataset.testid).join(),
              s = window.__buttons;
        if (!s.length || s[s.length - 1] !== b) s.push(b);
      }, 20);
    }""")
    box = pg.locator("#chat-message textarea")
    box.fill("Tell me a story.")
    served = health(tiny_url)["calls"]["served"]
    box.press("Enter")
    deadline = time.monotonic() + 60               # the engine served the reply; then the page wrote its last
    while health(tiny_url)["calls"]["served"] == served and time.monotonic() < deadline:
        time.sleep(0.2)
    pg.wait_for_function("() => window.__buttons.length >= 3", timeout=RUN_TIMEOUT)
    time.sleep(1.0)
    cells = pg.evaluate("window.__cells")
    assert len([n for n in cells if n]) >= 3 and cells == sorted(cells), cells     # the readout line grew
    assert pg.locator("#chat .lens-readout").count() == 1
    # the box's button: Send, Stop while the reply is written, Send again
    assert pg.evaluate("window.__buttons") == ["submit-button", "stop-button", "submit-button"]


@pytest.fixture
def slow_examples(monkeypatch):
    """The front page's other examples wait to be made until the test lets them (`release`; a second visit would
    find them in the answer memo at once): `made` is set once they are."""
    import threading

    from lensapp.ui import landing

    release, made, make = threading.Event(), threading.Event(), landing.other_examples
    release.set()

    def slow(*args, **kwargs):
        release.wait(120)
        try:
            return make(*args, **kwargs)
        finally:
            made.set()
    monkeypatch.setattr(landing, "other_examples", slow)
    return release, made


def test_a_generation_asked_while_the_page_draws_its_examples_is_not_written_over(browser, tiny_url, slow_examples):
    """The front page makes its other tabs' examples after the first one (slowly here): a generation the visitor
    asks meanwhile, and sees written, stays on the page (the Generation tab's example came after it and wrote
    itself over it)."""
    pg = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
    pg.goto(tiny_url)
    pg.get_by_role("tab", name="Generation").first.click()
    pg.wait_for_function("() => document.querySelector('#generate-text textarea')?.value", timeout=RUN_TIMEOUT)
    example = pg.locator("#generate-text textarea").input_value()    # the tab's example, as every visit draws it

    release, made = slow_examples
    release.clear()
    made.clear()
    pg = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
    pg.goto(tiny_url)
    pg.get_by_role("tab", name="Generation").first.click()
    pg.evaluate(RECORD)
    tokens_box = pg.locator("#generate-max-tokens input[type=number]")
    tokens_box.fill("2")
    tokens_box.press("Enter")
    pg.locator("#generate-run").click()
    pg.wait_for_function(f"() => window.__texts.some(t => t && t !== {json.dumps(example)})", timeout=RUN_TIMEOUT)
    assert not made.is_set(), "the page's examples were made before the generation was written: no race"
    release.set()                                                     # now they are made, after the generation
    assert made.wait(60)
    settled(tiny_url)
    time.sleep(1.5)
    texts = pg.evaluate("window.__texts")
    mine = [t for t in texts if t and t != example]
    assert texts[-1] == mine[-1] != example, texts

"""Kept means kept, in Chromium (issue 47): pages that read and chat, then one heavy legal link in another page, then
every session dropped on the server (what `--sessions` does past its bound): every page goes on, nothing it kept
is lost. A page's results are made again from the recipe it holds (`ui/kept.py`), its chat's conversation is the
one its Chatbot shows (`ui/chat_tab.py`)."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request

import pytest
from conftest import _page
from tiny_app import served

from lensapp import config

pytestmark = pytest.mark.browser

RUN_TIMEOUT = 120_000        # ms
# ~170 tokens (the tiny model reads 192), all layers at k 100: over the 1 MB store the test's app keeps
HEAVY_PROMPT = " ".join(["The old lighthouse keeper wrote in his log every night, and the sea answered him."] * 10)


@pytest.fixture(scope="module")
def tiny_pages(tiny_service):
    """The tiny app with a kept store of 1 MB, and its session store (to drop every session, as its bound would)."""
    from lensapp.server import make_app

    app = make_app(tiny_service, config.Config.of(rate_limit=0, session_mb=1))
    holder = next(r.app for r in app.routes if hasattr(r, "app") and hasattr(r.app, "state_holder")).state_holder
    with served(app) as url:
        yield url, holder


def kept_stats(url: str) -> dict:
    with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=30) as r:     # loopback: the host's view
        return json.loads(r.read())["sessions"]["kept"]


def chat(page, message: str, replies: int) -> None:
    """Send `message` in the chat and wait for the `replies`-th readout under a reply."""
    box = page.locator("#chat-message textarea")
    box.fill(message)
    box.press("Enter")
    page.wait_for_function(f"document.querySelectorAll('#chat .lens-readout').length >= {replies}"
                           " && document.querySelector('#chat-message [data-testid=submit-button]')",
                           timeout=RUN_TIMEOUT)       # the reply written whole: Send is back in place of Stop


def page_recipes(page) -> str:
    """What the page's kept states hold (their handles and recipes), as their hidden components' text."""
    return " ".join(page.locator(".kept-state").all_text_contents())


def download_rows(page) -> int:
    with page.expect_download(timeout=RUN_TIMEOUT) as download:
        page.get_by_role("button", name="Download CSV").first.click()
    return len(open(download.value.path(), encoding="utf-8").read().splitlines())


def test_a_heavy_link_and_dropped_sessions_take_nothing_a_page_kept(browser, tiny_pages):
    url, holder = tiny_pages
    _, reader = _page(browser, viewport={"width": 1400, "height": 1000})
    reader.goto(url)
    reader.get_by_role("tab", name="Logit lens").first.click()
    reader.wait_for_selector("#logit-heatmap svg.marks", timeout=RUN_TIMEOUT)
    rows = download_rows(reader)
    reader.get_by_role("tab", name="Generation").first.click()
    reader.get_by_role("tab", name="Chat").first.click()
    chat(reader, "My name is Ada.", 1)

    _, heavy = _page(browser, viewport={"width": 1400, "height": 1000})
    link = urllib.parse.urlencode({"v": 2, "tab": "logit", "prompt": HEAVY_PROMPT, "layers": "all", "k": 100})
    heavy.goto(f"{url}?{link}")
    heavy.wait_for_selector("#logit-heatmap svg.marks", timeout=RUN_TIMEOUT)
    heavy.wait_for_selector("#logit-window", state="visible", timeout=RUN_TIMEOUT)   # read whole, then kept
    stats = kept_stats(url)
    assert stats["too_large"] + stats["evicted"] >= 1, stats          # the heavy value did not fit beside the others

    with holder.lock:                                                 # every session dropped, as past --sessions
        gone = [holder._pop(sid) for sid in list(holder.session_data)]
    for session_id, session in gone:
        holder._give_back(session_id, session)
    assert kept_stats(url)["handles"] == 0

    chat(reader, "What is my name?", 2)                               # the conversation came from the page
    recipes = page_recipes(reader)
    assert "My name is Ada." in recipes and "What is my name?" in recipes
    reader.get_by_role("tab", name="Logit lens").first.click()
    assert download_rows(reader) == rows                              # its result, made again from its recipe
    heavy.get_by_role("tab", name="Logit lens").first.click()
    assert download_rows(heavy) > rows                                # and the heavy page's too
    for page in (reader, heavy):
        assert not page.errors and not page.locator(".toast-body:has-text('run it again')").count()

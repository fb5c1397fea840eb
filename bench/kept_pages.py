"""A workshop's pages and one heavy reader: does anything a page kept go missing? (issue 47)

Starts `lensapp serve` from a checkout (this one, or an older one with --repo, to measure before and after) and opens
`--pages` pages in one headless Chromium, as a room does: each page lands on the front page (its lens examples
kept), reads a short prompt of its own with the logit lens, and says two things in the chat. Then one more page
opens the heaviest legal link (`--words` words, every layer, top-100), and every page goes on: a third chat message
("What did I say first?") and a CSV download of its own lens readout (which reads what the page kept). Reported, as
one JSON line:

  kept         the kept store's counters from the host's /health (evicted, too_large, expired: reads of a result
               no longer kept, made again from the page's recipe since issue 47)
  run_again    pages told "run it again" (a result gone that the page could not make again): goal 0
  lost_chats   pages whose third message got no reply, or whose reply did not read their first message (the
               page's recipe holds the conversation the model read; before issue 47, a chat's history lived on the
               server and a page whose history was pushed out was told to run it again): goal 0
  wrong_rows   pages whose download differs from the one taken before the heavy link: goal 0
  memory       the web process's resident memory after the pages and its peak (MB)

    python bench/kept_pages.py [--pages 30] [--words 290] [--session-mb 64] [--repo /tmp/old]
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import psutil
from visitors_memory import ARGS, CHROMIUM, REPO, prompt, start

RUN_TIMEOUT = 300_000        # ms
FIRST, SECOND, THIRD = "My name is Ada {i}.", "I like rivers.", "What did I say first?"


def health(url: str) -> dict:
    with urllib.request.urlopen(url + "health", timeout=30) as r:       # loopback: the host's view
        return json.loads(r.read())


def chat(page, message: str, replies: int) -> None:
    box = page.locator("#chat-message textarea")
    box.fill(message)
    box.press("Enter")
    page.wait_for_function(f"document.querySelectorAll('#chat .lens-readout').length >= {replies}"
                           " && document.querySelector('#chat-message [data-testid=submit-button]')",
                           timeout=RUN_TIMEOUT)       # the reply written whole: Send is back in place of Stop


def rows(page) -> list[str]:
    with page.expect_download(timeout=RUN_TIMEOUT) as download:
        page.get_by_role("button", name="Download CSV").first.click()
    return Path(download.value.path()).read_text(encoding="utf-8").splitlines()


def open_page(browser, url: str, i: int) -> dict:
    page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
    page.set_default_timeout(RUN_TIMEOUT)       # thirty pages in one browser on two cores: a click waits long
    page.goto(url + "?" + urllib.parse.urlencode({"v": 2, "tab": "logit", "prompt": prompt(i, 8)}))
    page.wait_for_selector("#logit-heatmap svg.marks", timeout=RUN_TIMEOUT)
    before = rows(page)
    page.get_by_role("tab", name="Generation").first.click()
    page.get_by_role("tab", name="Chat").first.click()
    chat(page, FIRST.format(i=i), 1)
    chat(page, SECOND, 2)
    return {"i": i, "page": page, "rows": before}


def go_on(visit: dict) -> dict:
    """The page's third message and its download again; what went missing."""
    page, i = visit["page"], visit["i"]
    try:
        chat(page, THIRD, 3)
        answered = True
    except Exception:  # noqa: BLE001 - no reply (before issue 47: "run it again", its history gone)
        answered = False
    recipes = " ".join(page.locator(".kept-state").all_text_contents())    # none before issue 47
    page.get_by_role("tab", name="Logit lens").first.click()
    try:
        same = rows(page) == visit["rows"]
    except Exception:  # noqa: BLE001 - a download refused ("run it again") is what this bench counts
        same = False
    told = page.locator(".toast-body:has-text('run it again')").count()
    lost = not answered or bool(recipes) and FIRST.format(i=i) not in recipes
    return {"lost_chat": lost, "wrong_rows": not same, "run_again": told > 0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, default=30)
    ap.add_argument("--words", type=int, default=290, help="the heavy link's prompt, in words")
    ap.add_argument("--session-mb", type=int, default=64)
    ap.add_argument("--repo", type=Path, default=REPO, help="a checkout to serve (an older one: before)")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    proc, url = start(args.repo, ["--session-mb", str(args.session_mb), "--rate-limit", "0"])
    peak, stop = [0.0], threading.Event()

    def watch() -> None:
        while not stop.wait(0.5):
            peak[0] = max(peak[0], psutil.Process(proc.pid).memory_info().rss / 2**20)
    threading.Thread(target=watch, daemon=True).start()
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            t = time.perf_counter()
            visits = [open_page(browser, url, i) for i in range(args.pages)]
            heavy = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
            link = {"v": 2, "tab": "logit", "prompt": prompt(10_000, args.words), "layers": "all", "k": 100}
            heavy.goto(url + "?" + urllib.parse.urlencode(link))
            heavy.wait_for_selector("#logit-heatmap svg.marks", timeout=RUN_TIMEOUT)
            after_heavy = health(url).get("sessions", {}).get("kept", {})
            outcomes = [go_on(v) for v in visits]
            seconds = time.perf_counter() - t
            browser.close()
        kept = health(url).get("sessions", {}).get("kept", {})
        rss = psutil.Process(proc.pid).memory_info().rss / 2**20
    finally:
        stop.set()
        proc.terminate()
        proc.wait(timeout=120)
    print(json.dumps({"pages": args.pages, "heavy_words": args.words, "session_mb": args.session_mb,
                      "repo": str(args.repo), "kept_after_heavy": after_heavy, "kept": kept,
                      "run_again": sum(o["run_again"] for o in outcomes),
                      "lost_chats": sum(o["lost_chat"] for o in outcomes),
                      "wrong_rows": sum(o["wrong_rows"] for o in outcomes),
                      "memory_mb": round(rss), "memory_peak_mb": round(peak[0]), "seconds": round(seconds)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

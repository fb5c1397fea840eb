"""Sixty visitors who each open a link to a distinct long all-layer lens in Chromium, wait for its heatmap and close
the page leave the web process within its memory plan: the results their pages keep are bounded in bytes
(`ui/kept.py`, `--session-mb`) and their sessions keep no copy of what the page showed (`ui/sessions.py`).

Before this, each such visit (at k=100) added ~33 MB that stayed for an hour (bench/RESULTS.md): sixty would be
~2 GB. The shared app runs with small stores (`--cache-mb 64 --session-mb 32`: conftest.py), so these visits fill
and overflow them.
"""

from __future__ import annotations

import random
import time
from urllib.parse import quote

import psutil
from conftest import APP_PID
from test_serving import health, ready
from test_ui_browser import wait_plot

from lensapp import heap

MiB = 1 << 20
WORDS = ("river city light stone garden winter music letter market window forest bridge summer paper island "
         "engine yellow quiet morning silver ocean history school family travel kitchen mountain story").split()
VISITORS, AT_ONCE = 60, 6


def long_prompt(i: int) -> str:
    rng = random.Random(i)
    return f"Visitor {i} wrote: " + " ".join(rng.choice(WORDS) for _ in range(30))


def test_sixty_closed_sessions_each_a_distinct_long_lens_stay_within_the_plan(browser, app_url):
    ready(app_url)
    app = psutil.Process(APP_PID[0])
    before, rss_before = health(app_url), app.memory_info().rss
    plan = before["memory"]["plan"]
    contexts = [browser.new_context(viewport={"width": 1400, "height": 1000}) for _ in range(AT_ONCE)]
    pages = [ctx.new_page() for ctx in contexts]
    for first in range(0, VISITORS, AT_ONCE):
        # Each page opens the next visitor's link: the page before it, and its session, are left (closed).
        for i, page in enumerate(pages, start=first):
            page.errors = []
            page.goto(f"{app_url}?v=1&tab=logit&prompt={quote(long_prompt(i))}&layers=all&k=10", wait_until="commit")
        for page in pages:
            wait_plot(page, "logit-heatmap")
    for ctx in contexts:
        ctx.close()
    time.sleep(heap.SECONDS + 2)                                  # the app gives what it freed back (heap.py)
    after, rss_after = health(app_url), app.memory_info().rss
    kept = after["sessions"]["kept"]
    assert kept["bytes"] <= kept["max_bytes"] < plan["sessions_mb"] * MiB
    assert after["sessions"]["held"] <= after["sessions"]["capacity"]
    grown = rss_after - rss_before
    # All these visits may add is what the plan gives the results (the cache's line) and the visitors' sessions,
    # and what the allocator may keep before the app trims it (heap.GROWTH).
    allowed = (plan["result_cache_mb"] + plan["sessions_mb"]) * MiB + heap.GROWTH
    assert grown <= allowed, (f"the web process grew {grown / MiB:.0f} MB over {VISITORS} visits; the plan allows "
                              f"{allowed / MiB:.0f} MB for results and sessions", after["sessions"], after["cache"])
    assert after["cache"]["misses"] - before["cache"]["misses"] >= VISITORS     # each visit a distinct readout

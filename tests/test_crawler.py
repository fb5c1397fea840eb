"""A crawler walking links cannot take the engine from a visitor: every link it opens starts its readout only as
its own request (its turn, its budget: `ui/prefetch.py`), so it soon starts nothing, and a visitor's short lens
meanwhile is answered as quickly as alone but for what one other client may hold.

The real app (`server.make_app`) over the tiny service, served on loopback; the two clients are told apart by the
X-Forwarded-For entry of the one proxy the app trusts (`trusted_proxies=1`), as behind a Space's.
"""

from __future__ import annotations

import statistics
import threading
import time
import urllib.request
from urllib.parse import quote

import pytest
from tiny_app import served

from lensapp import config

CRAWLER, VISITOR = "198.51.100.9", "203.0.113.5"
LONG = " ".join(["river"] * 150)


@pytest.fixture(scope="module")
def app(tiny_service):
    from lensapp.server import make_app

    # A work budget of 3,000 units a minute in bursts of 4,000: each long link here costs ~750 units.
    cfg = config.Config.of(trusted_proxies="1", cache_entries=64, work_per_minute=3000, max_work=2000, rate_limit=600)
    built = make_app(tiny_service, cfg)
    prefetch = next(m.kwargs["prefetch"] for m in built.user_middleware if "prefetch" in m.kwargs)
    with served(built) as url:
        yield url, prefetch


def visitor_lens(client, times: list[float]) -> None:
    t = time.perf_counter()
    client.predict("The capital of France is", "logit", "all", 5, "", api_name="/lens")
    times.append(time.perf_counter() - t)


def test_a_crawler_starts_only_what_its_budget_allows_and_the_visitor_is_not_held(app, tiny_service):
    from gradio_client import Client

    url, prefetch = app
    visitor = Client(url, headers={"X-Forwarded-For": VISITOR}, verbose=False)
    alone: list[float] = []
    for _ in range(5):
        visitor_lens(visitor, alone)
    read_before, crawl_started = prefetch.read, time.perf_counter()

    def crawl():
        for i in range(40):
            link = f"{url}?v=1&tab=logit&prompt={quote(f'{i} {LONG}')}&layers=all&k=5"
            request = urllib.request.Request(link, headers={"X-Forwarded-For": CRAWLER})
            with urllib.request.urlopen(request, timeout=30) as r:
                r.read()
            time.sleep(0.1)                                   # the engine idle between its links

    crawler = threading.Thread(target=crawl)
    crawler.start()
    beside: list[float] = []
    try:
        for _ in range(10):
            visitor_lens(visitor, beside)
    finally:
        crawler.join(120)
    one_link = tiny_service.check(tiny_service_request(tiny_service)).units(tiny_service.token_weight)
    budget = 4000 + 3000 * (time.perf_counter() - crawl_started) / 60     # its burst, and what refilled meanwhile
    read = prefetch.read - read_before                        # let in and read (not refused for its work)
    assert 1 <= read <= budget / one_link + 1, (read, one_link)
    # The visitor waits at most for one of the crawler's readouts to finish beside its own (fair turns).
    assert statistics.median(beside) <= statistics.median(alone) + max(alone) + 1.0, (alone, beside)


def tiny_service_request(service):
    from lensapp.service import LensRequest

    return LensRequest.parse(prompts=[f"0 {LONG}"], lens="logit")


@pytest.fixture(scope="module")
def counted(tiny_service):
    """The app with the default count (60 requests a minute in bursts of 12) and work that never binds."""
    from lensapp.server import make_app

    cfg = config.Config.of(trusted_proxies="1", cache_entries=64, work_per_minute=10**9)
    built = make_app(tiny_service, cfg)
    prefetch = next(m.kwargs["prefetch"] for m in built.user_middleware if "prefetch" in m.kwargs)
    with served(built) as url:
        yield url, prefetch


def test_forty_link_gets_start_no_more_readouts_than_forty_api_calls(counted):
    """Each link's prefetch takes one of the address's requests, as an API call does: 40 distinct short links a
    tenth of a second apart start at most a burst and what refilled meanwhile (they started 40 before)."""
    url, prefetch = counted
    before, read_before, t = prefetch.started, prefetch.read, time.perf_counter()
    for i in range(40):
        request = urllib.request.Request(f"{url}?tab=logit&prompt={quote(f'page {i} of the crawl')}",
                                         headers={"X-Forwarded-For": CRAWLER})
        with urllib.request.urlopen(request, timeout=30) as r:
            r.read()
        time.sleep(0.1)
    allowed = 12 + (time.perf_counter() - t) * 60 / 60          # a burst, and one a second since
    assert 1 <= prefetch.read - read_before <= prefetch.started - before <= allowed + 1, (prefetch.started - before,
                                                                                       allowed)

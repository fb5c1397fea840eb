"""Which links start their readout when their page is asked for (`ui.prefetch`), on a stand-in service:
every tab's link but a fitted vector's and an unseeded sample's, the request its page will send, into an idle engine,
one at a time, as the visitor asking (one of its requests, its turn, its budget, not counted); nothing else.
tests/test_ui_browser.py checks on the engine that the page's own request finds the prefetch's in the cache."""

import asyncio
import dataclasses
import threading
import time
from types import SimpleNamespace
from urllib.parse import quote

import gradio as gr
import pytest

from lensapp import config
from lensapp.engine import ModelInfo
from lensapp.service import fields
from lensapp.service.asks import asked
from lensapp.service.limits import RateLimiter
from lensapp.ui import permalinks
from lensapp.ui.form import asked as asked_of
from lensapp.ui.guard import Guard
from lensapp.ui.lens_tab import LOGIT_TAB, lens_request
from lensapp.ui.prefetch import LinkPrefetch
from lensapp.ui.views import TAB_VIEWS, View


def started(prefetch: LinkPrefetch, query: str, client: str | None = None) -> bool:
    """What a link's GET asks of the prefetch (`LinkPrefetch.start`, awaited on the app's loop), from a test."""
    return asyncio.run(prefetch.start(query, client))


class Words:
    """A tokenizer of words: a prompt's length in tokens is its word count."""

    bos = False                 # no BOS first: a v=1 link's positions stay as written (ui/permalinks.py)

    def ids(self, prompt, chat=False):
        return prompt.split()


class StandIn:
    prompts = Words()

    def __init__(self, state="ready", in_flight=0, queue_depth=0, cost=0):
        self.info = ModelInfo("stand-in", 4, 8, 100, "none", "cpu", "float32")
        self.jlens, self.jlens_layers = None, []
        self.ready = state == "ready" and not in_flight and not queue_depth
        self.asked, self.release, self.turns, self.counted = [], threading.Event(), [], []
        self.cost = cost
        self.entries = []                       # the service's entries called other than `lens`

    def idle(self):
        return self.ready

    def health(self):
        raise AssertionError("a page asked for must not look at the engine's processes")

    def lens(self, req, read_from=0, ask=None):
        ask = asked(ask)                        # as the service's entries: the ask handed down, else the handler's
        self.asked.append((req, read_from) if read_from else req)
        self.turns.append(ask.client)
        self.counted.append(ask.counted)
        ask.pay(self.cost)                      # as the service does where engine work starts
        self.release.wait(10)
        return []

    def generate(self, req, ask=None):
        self.entries.append("generate")
        return self.lens(req, ask=ask)

    def compare(self, req, ask=None):
        self.entries.append("compare")
        return self.lens(req, ask=ask)

    def intervene(self, req, progress=None, ask=None):
        self.entries.append("intervene")
        return self.lens(req, ask=ask)

    def components(self, req, ask=None):
        self.entries.append("components")
        return self.lens(req, ask=ask)


def link(**fields) -> str:
    return "&".join(f"{k}={quote(str(v))}" for k, v in {"v": 1, **fields}.items())


def test_a_lens_link_prefetches_the_request_its_page_will_send():
    service = StandIn()
    prefetch = LinkPrefetch(service)
    assert started(prefetch, link(tab="logit", prompt="The capital of France is", layers="1-3", k=7, targets="Paris"))
    service.release.set()
    prefetch._runner.shutdown(wait=True)
    want, _ = lens_request(LOGIT_TAB, service, {"prompt": "The capital of France is", "layers": "1-3", "k": 7,
                                                "targets": "Paris", "chat": False, "raw": False})
    assert service.asked == [want]


def test_a_long_link_prefetches_its_drawn_window_then_the_whole_prompt():
    """What the page asks first (the last 48 positions of 200, `lens_tab.first_read`), then what it asks next;
    a link's own window (start=120) is read from there; one from start=10 would read 190 of 200 first: it
    reads them all at once."""
    service = StandIn()
    service.release.set()
    prompt = " ".join(f"w{i}" for i in range(200))
    for start, first in ((None, 152), (120, 120), (170, 152), (10, 0)):
        service.asked.clear()
        prefetch = LinkPrefetch(service)
        fields = {"tab": "logit", "prompt": prompt} | ({"start": start} if start is not None else {})
        assert started(prefetch, link(**fields))
        prefetch._runner.shutdown(wait=True)
        want, _ = lens_request(LOGIT_TAB, service, {"prompt": prompt, "chat": False, "raw": False})
        assert service.asked == ([(want, first)] if first else []) + [want]


def test_a_link_that_skips_punctuation_prefetches_that_request():
    service = StandIn()
    prefetch = LinkPrefetch(service)
    assert started(prefetch, link(tab="logit", prompt="The Eiffel Tower is in the city of", punct=1))
    service.release.set()
    prefetch._runner.shutdown(wait=True)
    want, _ = lens_request(LOGIT_TAB, service, {"prompt": "The Eiffel Tower is in the city of", "layers": "all", "k": 5,
                                                "targets": "", "punct": True})
    assert service.asked == [want] and want.skip_punctuation


def test_only_into_an_idle_engine_and_one_at_a_time():
    busy = StandIn(in_flight=1)
    assert not started(LinkPrefetch(busy), link(tab="logit", prompt="x"))
    assert not started(LinkPrefetch(StandIn(queue_depth=2)), link(tab="logit", prompt="x"))
    assert not started(LinkPrefetch(StandIn(state="restarting")), link(tab="logit", prompt="x"))
    service = StandIn()
    prefetch = LinkPrefetch(service)
    assert started(prefetch, link(tab="logit", prompt="first"))
    assert not started(prefetch, link(tab="logit", prompt="second"))       # the first is still running
    service.release.set()
    prefetch._runner.shutdown(wait=True)
    assert [r.prompts for r in service.asked] == [("first",)] and busy.asked == []


def test_other_links_start_nothing_and_a_bad_field_falls_back_as_on_the_page():
    service = StandIn()
    prefetch = LinkPrefetch(service)
    for query in ["", link(tab="jacobian", prompt="x"),                                    # no Jacobian lens here
                  link(tab="generate", prompt="x", temperature=0.8),       # a fresh sample: its page draws another
                  link(tab="intervene", prompt="x", word="Rome", layer=2, direction="fitted")]:
        assert not started(prefetch, query), query
    assert not started(LinkPrefetch(service, enabled=False), link(tab="logit", prompt="x"))
    assert started(prefetch, link(tab="logit", prompt="x", k="many", layers="\x00"))   # the page uses k=5, all layers
    service.release.set()
    prefetch._runner.shutdown(wait=True)
    (req,) = service.asked
    assert (req.prompts, req.k, req.layers) == (("x",), 5, "all")


def test_a_prefetch_is_the_visitors_own_request_in_its_turn_and_budget_and_not_counted():
    service = StandIn(cost=5000)
    guard = Guard(RateLimiter(per_minute=60, clock=lambda: 0.0, work_per_minute=6000, work_burst=4000))
    prefetch = LinkPrefetch(service, guard)
    service.release.set()
    assert started(prefetch, link(tab="logit", prompt="one"), "203.0.113.7")
    prefetch._runner.shutdown(wait=True)
    assert service.turns == ["203.0.113.7"] and service.counted == [False]
    prefetch = LinkPrefetch(service, guard)
    assert not started(prefetch, link(tab="logit", prompt="two"), "203.0.113.7")  # its budget is spent: nothing starts
    assert started(prefetch, link(tab="logit", prompt="three"), "198.51.100.4")    # another visitor's is its own
    prefetch._runner.shutdown(wait=True)
    assert [r.prompts for r in service.asked] == [("one",), ("three",)]


def test_forty_link_gets_start_no_more_readouts_than_forty_api_calls_would_get():
    """A crawler (a chat app's link preview runs no script) GETs 40 distinct links, a tenth of a second apart, from
    one address: each prefetch takes a request as an API call does, so no more start than 40 API calls at the
    same moments are answered (the default limits: 60 a minute in bursts of 12). Loopback stays exempt."""
    def stopped_guard(now):
        limiter = RateLimiter.of(config.LimitSettings())
        limiter.clock = lambda: now[0]
        return Guard(limiter)

    crawler = "198.51.100.9"
    service = StandIn(cost=300)
    service.release.set()
    now = [0.0]
    prefetch = LinkPrefetch(service, stopped_guard(now))
    for i in range(40):
        started(prefetch, link(tab="logit", prompt=f"page {i}"), crawler)
        prefetch._runner.submit(lambda: None).result()          # done: the engine idle before the next GET
        now[0] += 0.1
    api_now, answered = [0.0], 0
    api = stopped_guard(api_now)
    asking = SimpleNamespace(client=SimpleNamespace(host=crawler), headers={})
    for _ in range(40):
        try:
            api.api(asking, lambda: asked().pay(300))        # what a service entry pays, given no ask
            answered += 1
        except gr.Error:
            pass
        api_now[0] += 0.1
    assert len(service.asked) == prefetch.read == prefetch.started <= answered < 40, (prefetch.started, answered)
    host = LinkPrefetch(service, stopped_guard([0.0]))
    for i in range(40):                                          # the host's own scripts: never limited
        assert started(host, link(tab="logit", prompt=f"host {i}"), "127.0.0.1")
        host._runner.submit(lambda: None).result()


@pytest.mark.parametrize("view", [
    View(tab="generate", prompt="The capital of France is", max_tokens=5),
    View(tab="generate", prompt="The capital of France is", temperature=0.8, seed=7),
    View(tab="compare", prompts=("The capital of France is", "The capital of Italy is"), k=3, targets=("Paris",)),
    View(tab="intervene", prompt="The capital of France is", word="Rome", layer="1", alphas=(2.0,)),
    View(tab="intervene", intervention="ablate", prompt="The capital of France is", layer="1-2"),
    View(tab="components", prompt="The capital of France is", target="Paris", foil="Rome", position=-1),
])
def test_the_other_tabs_links_prefetch_the_request_their_page_will_send(view):
    service = StandIn()
    prefetch = LinkPrefetch(service)
    assert started(prefetch, permalinks.query_string(view))
    service.release.set()
    prefetch._runner.shutdown(wait=True)
    tab = TAB_VIEWS[view.tab]
    assert service.asked == [asked_of(tab, service, tab.values_of(view))] and service.entries == [view.tab]


@pytest.mark.parametrize("view, first", [
    (View(tab="intervene", prompt="The capital of France is", word="Rome", layer="1-2", alphas=(2.0, 4.0),
          new_tokens=3), {"alphas": (4.0,)}),
    (View(tab="intervene", prompt="The capital of France is", word="Rome", layer="-1"),
     {"alphas": fields.DEFAULT_ALPHAS[-1:]}),
    (View(tab="intervene", intervention="patch", prompt="The capital of France is",
          source="The capital of Italy is", layer="1-3"), {"layer": "3"}),
])
def test_a_sweeps_link_reads_its_pictures_change_first_then_the_whole(view, first):
    """An intervention's first chart is the readout before and the sweep's last change (`intervene_tab.picture`): a
    link to a sweep reads those first, with no texts generated, then the request its page will send."""
    service = StandIn()
    service.release.set()
    prefetch = LinkPrefetch(service)
    assert started(prefetch, permalinks.query_string(view))
    prefetch._runner.shutdown(wait=True)
    tab = TAB_VIEWS["intervene"]
    whole = asked_of(tab, service, tab.values_of(view))
    assert service.entries == ["intervene", "intervene"]
    assert service.asked == [dataclasses.replace(whole, **first, new_tokens=0), whole]
    assert whole.new_tokens == (3 if view.alphas else 0) and len(fields.DEFAULT_ALPHAS) > 1


# -- a link's page and its first view, through the app's own middleware and route (server.py) --------------------

PAGE = b"<!doctype html><html><head><title>page</title></head><body></body></html>"


def page_app(prefetch, loop_threads: list):
    """The app's middleware (`server.PrefetchLinks`) and `/first-view` route (`server.first_view_route`) around a
    bare page, one proxy trusted (each test's address is its X-Forwarded-For)."""
    from starlette.applications import Starlette
    from starlette.responses import HTMLResponse
    from starlette.routing import Route

    from lensapp import server

    async def page(request):
        loop_threads.append(threading.get_ident())
        return HTMLResponse(PAGE)

    app = Starlette(routes=[Route("/", page), Route("/first-view", server.first_view_route(prefetch, 1))])
    return server.PrefetchLinks(app, prefetch, trusted_proxies=1)


def ticket_of(html: str) -> str | None:
    import json
    import re

    from lensapp.ui import first_view

    found = re.search(f'<script type="application/json" id="{first_view.SETTINGS_ID}">(.*?)</script>', html)
    return json.loads(found.group(1))["ticket"] if found else None


A, A2, B = {"x-forwarded-for": "203.0.113.7"}, {"x-forwarded-for": "203.0.113.7"}, {"x-forwarded-for": "198.51.100.4"}


def test_a_links_get_reads_the_link_off_the_event_loop_and_only_into_an_idle_engine(monkeypatch):
    """The link's parse (and a v=1 link's tokenizing, inside it) runs on the prefetch's thread, and only once the
    engine was found idle with no prefetch running: a GET into a busy engine reads nothing of its link."""
    from fastapi.testclient import TestClient

    from lensapp.ui import prefetch as prefetching

    read_on, real = [], permalinks.decode

    def decode(query, **kwargs):
        read_on.append(threading.get_ident())
        return real(query, **kwargs)

    monkeypatch.setattr(prefetching.permalinks, "decode", decode)
    loop_threads = []
    with TestClient(page_app(LinkPrefetch(StandIn(in_flight=1)), loop_threads)) as client:
        assert client.get("/?" + link(tab="logit", prompt="x y z"), headers=A).text == PAGE.decode()
    assert read_on == []                                 # a busy engine: the link is not even read

    service = StandIn()
    prefetch = LinkPrefetch(service)
    with TestClient(page_app(prefetch, loop_threads)) as client:
        assert ticket_of(client.get("/?" + link(tab="logit", prompt="x y z"), headers=A).text)
    service.release.set()
    prefetch._runner.shutdown(wait=True)
    assert read_on and loop_threads and set(read_on).isdisjoint(loop_threads)   # read on the prefetch's thread


def test_a_links_picture_goes_only_to_a_page_its_own_address_opened_and_says_nothing_of_others():
    """While A's readout of a link is under way, B (another address) opening the same link is given no first view
    (as for a link nobody opened: the engine is busy), A's room (its address) is; an ask with no ticket, or with
    another's, is answered 204 at once; A's ticket gets the picture once."""
    from fastapi.testclient import TestClient

    service = StandIn()
    prefetch = LinkPrefetch(service)
    query = link(tab="logit", prompt="a secret prompt")
    with TestClient(page_app(prefetch, [])) as client:
        first = ticket_of(client.get("/?" + query, headers=A).text)
        assert first and prefetch.started == 1
        assert ticket_of(client.get("/?" + query, headers=B).text) is None        # as a link nobody opened
        assert ticket_of(client.get("/?" + link(tab="logit", prompt="never"), headers=B).text) is None
        second = ticket_of(client.get("/?" + query, headers=A2).text)             # A's room finds it
        assert second and second != first and prefetch.started == 1
        t = time.monotonic()
        for ask, headers in ((f"/first-view?{query}", B), (f"/first-view?{query}", A), (f"/first-view?t={first}", B),
                             ("/first-view?t=forged", A)):
            assert client.get(ask, headers=headers).status_code == 204, ask
        assert time.monotonic() - t < 1                                           # no wait for any of them
        prefetch.first_views.put(A["x-forwarded-for"], query, '{"mark": "rect"}')  # the readout's picture
        asked = client.get(f"/first-view?t={first}", headers=A)
        assert asked.status_code == 200 and asked.json() == {"mark": "rect"}
        assert client.get(f"/first-view?t={first}", headers=A).status_code == 204  # a ticket is good once
        assert client.get(f"/first-view?t={second}", headers=A2).json() == {"mark": "rect"}
    service.release.set()
    prefetch._runner.shutdown(wait=True)


def test_a_pages_ask_is_woken_when_its_picture_comes():
    """Waited for by an event: the answer follows the picture within a few ms (a 50 ms poll: 25 ms on average)."""
    import asyncio

    from lensapp.ui.first_view import FirstViews

    async def lags() -> list[float]:
        views, out = FirstViews(), []
        for i in range(9):
            views.expect("a", f"q{i}")
            ask = asyncio.create_task(views.get(views.ticket("a", f"q{i}"), "a", wait=5))
            await asyncio.sleep(0.02)
            put = time.monotonic()
            threading.Thread(target=views.put, args=("a", f"q{i}", "{}")).start()
            assert await ask == "{}"
            out.append(time.monotonic() - put)
        return sorted(out)

    assert asyncio.run(lags())[4] < 0.012

"""Start a shared link's readout while its page loads, as the visitor asking for the page.

A permalink's page needs ~2 s to load and start (Gradio's scripts, its config, the link's restore)
before it asks for the readout, which for a long prompt is seconds of engine time more. The server
sees the link when the browser first asks for the page, so it starts the same requests then: a long prompt's
drawn window first, then the whole prompt (`lens_tab.readout`, `first_read`); the page's own requests, built the
same way from the same values (`lens_tab.lens_request`), join them in the result cache (identical requests in
flight are computed once) or find them done.

It is a request the visitor makes, as an API call is (`Guard.ask_of`, handed to the service): it takes one of the
address's requests (`RateLimiter.check`), waits in its turn, and its work is taken from its budget or refused
(`RateLimiter.spend`).
So a crawler following links (a chat app's link preview runs no script) gets no more readouts than as many API
calls would, and soon starts nothing; a visitor opening a link pays two requests (the link's, and its page's,
which the cache then answers for nothing). A page's GET carries no session (the page's script makes one later),
so a prefetch is always its address's, never a person's told apart behind it (`identity.People`). Serving only what
is already cached was the other choice, and no choice: the page's own request finds that at once, so a prefetch
would start nothing worth having.

Only into idle capacity besides: only while the engine is ready with nothing running or queued (two counters
read, nothing walked), one at a time; only then is the link read (its parse, a v=1 link's tokenizing), on the
prefetch's thread, never on the app's event loop (`start`). It is not counted in a workshop's usage (the page's own
request is). Not with a login (the page is the login form) or without a result cache. Every tab's link but a fitted
vector's and a sample's without a seed (its page draws a fresh sample). A generation's link is read whole, as its
page reads it (the page's own Generate streams; a link's restore asks the generation once, with the branches it
names).

Once read, the tab's first chart of the answer is kept for the link's page (`first_view.FirstViews`), which draws
it before it has started: kept for the address whose GET started it, and handed only to a page whose own GET was
given a ticket for it (`open`): one that started the readout, or found it started or kept for its own address
(a room opening one link). An ask without one is answered at once with nothing, whoever else opened that link.
Where that chart needs less than the whole readout (an intervention's sweep: its first chart is the readout before
and the last change), that part is read first and kept, then the whole (its budget pays both).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Callable

from ..service.asks import HOST, Ask
from ..service.limits import RateLimited
from . import compare_tab, components_tab, generate_tab, intervene_tab, permalinks
from .first_view import FirstViews
from .form import asked, has_lens
from .lens_tab import LENS_TABS, first_heatmap, first_read, lens_request
from .views import START, TAB_VIEWS

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class OneShot:
    """A tab whose link's page asks its readout once (`run` of generate_tab, compare_tab, intervene_tab,
    components_tab), the request built as the page builds it (`form.asked`): the service's entry it calls
    (`read(service, req, ask)`), the tab's first chart of its answer (`picture(req, values, result)`: the link's
    first view, `first_view.py`), and where that chart needs less than the whole answer, the request that reads
    only that (`first(service, req)`, or None)."""

    read: Callable
    picture: Callable
    first: Callable | None = None


ONE_SHOT = {
    "generate": OneShot(lambda service, req, ask: service.generate(req, ask=ask), generate_tab.picture),
    "compare": OneShot(lambda service, req, ask: service.compare(req, ask=ask), compare_tab.picture),
    "intervene": OneShot(lambda service, req, ask: service.intervene(req, ask=ask), intervene_tab.picture,
                         intervene_tab.first_read),
    "components": OneShot(lambda service, req, ask: service.components(req, ask=ask), components_tab.picture),
}


class LinkPrefetch:
    def __init__(self, service, guard=None, enabled: bool = True):
        """guard: whose budget and turn a prefetch is (`ui.guard.Guard`); None: the host's (scripts, tests)."""
        self.service, self.guard = service, guard
        self.enabled = enabled
        self.first_views = FirstViews()               # a link's first chart, for its page's first view
        self.started = 0                             # let in: a request taken (its work may yet be refused)
        self.read = 0                                # of those, the ones whose work the budget took: read
        self._one = threading.Lock()                 # held while a prefetch runs
        self._runner = ThreadPoolExecutor(1, thread_name_prefix="lens-prefetch")

    def close(self) -> None:
        """Stop the prefetch thread (the app closing): what is queued is dropped, a prefetch under way finishes."""
        self._runner.shutdown(wait=True, cancel_futures=True)

    async def open(self, query: str, client: str | None = None) -> str | None:
        """A link's page asked for by `client` (its address, as the guard derives it), on the app's event loop: the
        readout it links to started (`start`) or found under way or kept for that address, and the ticket its page
        asks for its first chart with (`first_views.get`); None: it has none."""
        if not self.enabled or not query:
            return None
        if not self.first_views.knows(client, query) and not await self.start(query, client):
            return None
        return self.first_views.ticket(client, query)

    async def start(self, query: str, client: str | None = None) -> bool:
        """Start the readout `query` (a page URL's query) links to, for `client` (its address, as the guard derives
        it), if the engine is idle, no prefetch runs, its page asks one (`_job`) and the client's budget allows;
        from the app's event loop: the link is read (its parse, a v=1 link's tokenizing) on the prefetch's thread,
        only once the engine is found idle with no prefetch running. Never raises; True when a prefetch started."""
        if not self._claim(query):
            return False
        try:
            done = self._runner.submit(self._launch, query, client)
        except RuntimeError:                          # closed: the app is stopping
            self._one.release()
            return False
        # shielded: a visitor who leaves meanwhile leaves the launch to finish (it lets go of `_one`)
        return await asyncio.shield(asyncio.wrap_future(done))

    def _claim(self, query: str) -> bool:
        """Whether a prefetch may start, nothing of the link read yet (two counters and a lock): enabled, a query,
        the engine idle, none running. True: `_one` is held for `_launch`."""
        return self.enabled and bool(query) and self.service.idle() and self._one.acquire(blocking=False)

    def _launch(self, query: str, client: str | None) -> bool:
        """With `_one` held: the link read, and its prefetch started as `client`'s request (`_one` let go if not)."""
        try:
            job = self._job(query)
            if job is not None and self._takes_a_request(client):
                self.first_views.expect(client, query)
                self._runner.submit(self._run, job, client, query)
                self.started += 1
                return True
        except Exception as e:  # noqa: BLE001 - a link the page itself will explain; its GET is answered all the same
            log.debug("not prefetching %r: %s", query[:80], e)
            self.first_views.put(client, query, None)
        self._one.release()
        return False

    def _job(self, query: str) -> Callable[[Ask, str | None], None] | None:
        """What the link's page will ask, as a call of who asks (its ask, and its address: whose first view it
        keeps); None: nothing to start."""
        service = self.service
        view, _ = permalinks.decode(query, **permalinks.as_read_by(service))
        tab = LENS_TABS.get(view.tab)
        if tab is not None:
            if not has_lens(service, tab.lens):
                return None
            values = {**tab.view.values_of(view), "note": view.note}
            req, _ = lens_request(tab, service, values)
            return partial(self._read_lens, query, tab, values, req)
        if view.tab not in ONE_SHOT:
            return None
        tab_view = TAB_VIEWS[view.tab]
        values = tab_view.values_of(view)
        req = asked(tab_view, service, values)
        if not asked_again_the_same(req):
            return None
        return partial(self._read_once, query, ONE_SHOT[view.tab], req, values)

    def _read_lens(self, query: str, tab, values: dict, req, ask: Ask, owner: str | None) -> None:
        """A lens link's readout: a long prompt's drawn window first, then the whole prompt (`lens_tab.readout`).
        Its first heatmap is kept for the link's page as soon as it can be drawn (`first_views`)."""
        first = first_read(self.service, req, START(values.get("start")))
        results = self.service.lens(req, read_from=first, ask=ask)
        self._keep_first_view(owner, query, lambda: first_heatmap(tab, self.service, values, results[0]))
        if first:
            self.service.lens(req, ask=ask)

    def _read_once(self, query: str, tab: OneShot, req, values: dict, ask: Ask, owner: str | None) -> None:
        """Another tab's link's readout, and its first chart kept for its page: read first on its own where it
        needs less than the whole (`OneShot.first`; an intervention's sweep: ~0.9 s sooner, bench/RESULTS.md)."""
        first = tab.first(self.service, req) if tab.first is not None else None
        if first is not None:
            shown = tab.read(self.service, first, ask)
            self._keep_first_view(owner, query, lambda: tab.picture(first, values, shown))
        result = tab.read(self.service, req, ask)
        if first is None:
            self._keep_first_view(owner, query, lambda: tab.picture(req, values, result))

    def _keep_first_view(self, owner: str | None, query: str, draw: Callable) -> None:
        """The first chart of a link's page (`draw()`), kept for it: a picture that cannot be drawn is none (the
        page draws its own)."""
        try:
            chart = draw()
        except Exception as e:  # noqa: BLE001 - the page's own readout will meet and report it
            log.debug("no first view for %r: %s", query[:80], e)
            return
        self.first_views.put(owner, query, chart.plot if chart is not None else None)

    def _takes_a_request(self, client: str | None) -> bool:
        """One of `client`'s requests taken, as an API call takes it; False when its rate refuses."""
        if self.guard is None:
            return True
        try:
            self.guard.limiter.check(client)
        except RateLimited:
            return False
        return True

    def _run(self, job: Callable[[Ask, str | None], None], client: str | None, query: str) -> None:
        read = False
        try:
            ask = dataclasses.replace(self.guard.ask_of(client) if self.guard is not None else HOST, counted=False)
            job(ask, client)
            read = True
        except Exception as e:  # noqa: BLE001 - the page's own request will meet and report it
            log.debug("prefetch failed: %s", e)
        finally:
            self.read += read
            self.first_views.put(client, query, None)  # its page waits no longer (a chart kept stays)
            self._one.release()


def asked_again_the_same(req) -> bool:
    """Whether the link's page, asking `req`, is best served by the prefetch's answer: not a sample without a seed
    (the page draws a fresh one), and not a fitted vector (its page shows the fit's steps as they come)."""
    return getattr(req, "direction", None) != "fitted" and not (getattr(req, "sampled", False) and req.seed is None)

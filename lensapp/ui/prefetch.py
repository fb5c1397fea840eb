"""Start a shared link's readout while its page loads.

A permalink's page needs ~2 s to load and start (Gradio's scripts, its config, the link's restore)
before it asks for the readout, which for a long prompt is seconds of engine time more. The server
sees the link when the browser first asks for the page, so it starts the same request then; the page's
own request, built the same way from the same values (`lens_tab.lens_request`), joins it in the result cache (identical
requests in flight are computed once) or finds it done.

Only into idle capacity: a link prefetches only while the engine is ready with nothing running or
queued, one at a time, so a crawler following links cannot take the engine from people. Not with
a login (the page is the login form) or without a result cache. The lens tabs only: a generation or
comparison link waits for its page.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor

from . import permalinks
from .lens_tab import LENS_TABS, lens_request

log = logging.getLogger(__name__)


class LinkPrefetch:
    def __init__(self, service, enabled: bool = True):
        self.service = service
        self.enabled = enabled
        self.started = 0
        self._one = threading.Lock()                 # held while a prefetch runs
        self._runner = ThreadPoolExecutor(1, thread_name_prefix="lens-prefetch")

    def __call__(self, query: str) -> bool:
        """Start the readout `query` (a page URL's query) links to, if it is a lens link and the engine
        is idle. Never raises; True when a prefetch started."""
        if not self.enabled or not query:
            return False
        try:
            req = self._request(query)
        except Exception as e:  # noqa: BLE001 - a link the page itself will explain
            log.debug("not prefetching %r: %s", query[:80], e)
            return False
        if req is None or not self._idle() or not self._one.acquire(blocking=False):
            return False
        self.started += 1
        self._runner.submit(self._run, req)
        return True

    def _request(self, query: str):
        service = self.service
        view, _ = permalinks.decode(query, n_layers=service.info.n_layers, jlens_layers=service.jlens_layers)
        tab = LENS_TABS.get(view.tab)
        if tab is None or (tab.lens != "logit" and service.jlens is None):
            return None
        req, _ = lens_request(tab, service, tab.view.values_of(view))
        return req

    def _idle(self) -> bool:
        h = self.service.health()
        return h.get("state") == "ready" and not h.get("in_flight") and not h.get("queue_depth")

    def _run(self, req) -> None:
        try:
            self.service.lens(req)
        except Exception as e:  # noqa: BLE001 - the page's own request will meet and report it
            log.debug("prefetch failed: %s", e)
        finally:
            self._one.release()

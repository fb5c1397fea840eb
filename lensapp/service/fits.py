"""The fitting desk: fitted steering vectors, one at a time, for whoever may ask, cached.

A fit takes a core for up to `max_fit_seconds` in its own process (`fitting/worker.py`), so fits are
served one at a time from a short line: at most `fit_queue` wait, each told its place while it waits,
and one more is told the desk is busy. Who may ask is the host's choice (`fitting`): `anyone`, the
`host` (a logged-in visitor when the app has a login, else the machine's own users: the command line,
loopback), or `off`; the memory plan may also turn fitting off where the model's second copy does not
fit (`off_reason`). Identical fits (same prompt, layer, target and settings) are computed once: one
already under way is waited for (not queued again), and the cache is read and written under a lock.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Callable

from cachetools import LRUCache

from ..config import EngineSettings, SteeringFitSettings
from ..fitting.worker import FitJob, FitStopped, FitWorker
from .asks import HOST, Ask
from .field import RequestError

FITS_KEPT = 32

# (step, p(target), ||v||) at each step of a fit; (-n, 0, 0) while it waits with n fits ahead of it.
Progress = Callable[[int, float, float], None]


class FitDesk:
    """`settings`: the desk's own; `fit_queue`: the limits' fits that may wait; `engine`: the model its worker
    loads; `has_login`: whether the app asks for a login (the host's, when `fitting` is `host`)."""

    def __init__(self, settings: SteeringFitSettings, fit_queue: int, engine: EngineSettings, has_login: bool,
                 off_reason: str | None = None):
        self.settings, self.fit_queue, self.has_login, self.off_reason = settings, fit_queue, has_login, off_reason
        self._worker = FitWorker(engine, threads=settings.fit_threads)
        self._cache = LRUCache(FITS_KEPT)      # the latest fits asked for, the least recently asked out first
        self._cache_lock = threading.Lock()
        self._desk = threading.Lock()            # the fitter: one job at a time
        self._line = threading.Lock()            # guards `_waiting` and `_pending`
        self._waiting = 0                        # fits running or waiting
        self._pending: dict[tuple, Future] = {}  # fits under way, by their inputs: an identical ask waits for it

    def check_allowed(self, client: str | None = None) -> None:
        """RequestError, one line, when `client` (an ask's: None, the host) may not fit here (before any work is
        planned)."""
        settings = self.settings
        if settings.max_fit_steps == 0 or settings.fitting == "off":
            raise RequestError("fitting steering vectors is turned off here")
        if self.off_reason:
            raise RequestError(f"fitting steering vectors is off here: {self.off_reason}")
        if settings.fitting == "host" and client is not None and not self.has_login:
            raise RequestError("fitting steering vectors is for the host here (a logged-in visitor); use a "
                               "logit or jacobian direction")

    def fit(self, ids: tuple[int, ...], layer: int, target_id: int, steer, progress: Progress | None = None,
            work: int = 0, ask: Ask = HOST):
        """The SteeringVector for these inputs: from the cache, from the same fit already under way, or fitted
        when its turn comes; `work` (cost.py's units) is paid by whoever asks (`ask`) when it is fitted for them."""
        self.check_allowed(ask.client)
        key = (ids, layer, target_id, steer)
        if (hit := self._cached(key)) is not None:
            return hit
        with self._line:
            pending = self._pending.get(key)
            if pending is None:                  # not under way: take a place in line, or be told to come back
                if self._waiting >= self.fit_queue + 1:
                    raise RequestError(f"{self._waiting} steering fits are running or waiting (the most this "
                                       "app takes); try again in a minute")
                pending = self._pending[key] = Future()
                self._waiting += 1
                place, mine = self._waiting, True
            else:
                mine = False
        if not mine:                             # the same fit is under way for someone else: its answer
            return pending.result()
        try:
            ask.pay(work)
            if progress is not None and place > 1:
                progress(-(place - 1), 0.0, 0.0)                    # its place: fits ahead of it
            with self._desk:
                fit = self._fit(key, progress)
            pending.set_result(fit)
            return fit
        except BaseException as e:
            pending.set_exception(e)
            raise
        finally:
            with self._line:
                self._waiting -= 1
                del self._pending[key]

    def _fit(self, key, progress: Progress | None):
        ids, layer, target_id, steer = key
        try:
            fit = self._worker.fit(FitJob(ids, layer, target_id, steer), self.settings.max_fit_seconds, progress)
        except FitStopped as e:
            raise RequestError(str(e)) from None
        with self._cache_lock:
            self._cache[key] = fit
        return fit

    def close(self) -> None:
        self._worker.close()

    def _cached(self, key):
        with self._cache_lock:
            return self._cache.get(key)         # a hit is the most recently used now

"""Results of identical requests, computed once: a bounded LRU cache with in-flight sharing.

The key is everything that decides the answer (the model, the Jacobian lens's fingerprint, the
normalised request), built by the service. When the same link is opened by sixteen people at once,
the first request computes and the other fifteen wait for it (they never reach the engine); later
ones are served from memory until the entry is evicted. Bounded by entries and by bytes, both from
`Config` (`cache_entries`, `cache_mb`). Failures are shared with the waiters but never cached.

Results computed or read inside `with cache.pinning():` are kept apart and never evicted, whatever the
bounds: the front page's examples (`ui/front.py`), so a crowd of visitors never costs an engine forward
however many other links it opens.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import threading
from collections import OrderedDict
from concurrent.futures import Future
from typing import Callable, Hashable, TypeVar

import numpy as np

T = TypeVar("T")
_PINNING = contextvars.ContextVar("pinning", default=False)


class ResultCache:
    def __init__(self, max_entries: int, max_bytes: int):
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._done: OrderedDict[Hashable, tuple[object, int]] = OrderedDict()
        self._in_flight: dict[Hashable, Future] = {}
        self._pinned: dict[Hashable, object] = {}
        self._lock = threading.Lock()
        self.bytes = 0
        self.hits = self.shared = self.misses = 0

    @contextlib.contextmanager
    def pinning(self):
        """Within this block (this thread), results are pinned: kept for good, outside the bounds."""
        token = _PINNING.set(True)
        try:
            yield
        finally:
            _PINNING.reset(token)

    def get_or_compute(self, key: Hashable, compute: Callable[[], T]) -> T:
        return self.get_many([key], lambda todo: [compute()])[0]

    def get_many(self, keys: list[Hashable], compute: Callable[[list[int]], list[T]]) -> list[T]:
        """The value for each key: cached, shared with an identical request in flight, or computed by one
        call `compute(indices of the missing keys) -> their values`."""
        out: list = [None] * len(keys)
        waiting: dict[int, Future] = {}
        mine: dict[int, Future] = {}
        pin = _PINNING.get()
        with self._lock:
            for i, key in enumerate(keys):
                if key in self._pinned:
                    self.hits += 1
                    out[i] = self._pinned[key]
                elif key in self._done:
                    self._done.move_to_end(key)
                    self.hits += 1
                    out[i] = self._done[key][0]
                    if pin:                          # computed by a visitor first: pinned from now on
                        self._pinned[key], size = self._done.pop(key)
                        self.bytes -= size
                elif key in self._in_flight:
                    self.shared += 1
                    waiting[i] = self._in_flight[key]
                elif any(keys[j] == key for j in mine):      # the same key twice in one request
                    waiting[i] = mine[next(j for j in mine if keys[j] == key)]
                else:
                    mine[i] = self._in_flight[key] = Future()
        if mine:
            todo = list(mine)
            try:
                values = compute(todo)
            except BaseException as e:
                with self._lock:
                    for i in todo:
                        self._in_flight.pop(keys[i], None)
                for i in todo:
                    mine[i].set_exception(e)
                raise
            with self._lock:
                for i, value in zip(todo, values):
                    self._in_flight.pop(keys[i], None)
                    self.misses += 1
                    if pin:
                        self._pinned[keys[i]] = value
                    else:
                        self._store(keys[i], value)
            for i, value in zip(todo, values):
                out[i] = value
                mine[i].set_result(value)
        for i, future in waiting.items():
            out[i] = future.result()
        return out

    def _store(self, key: Hashable, value) -> None:
        size = approx_bytes(value)
        if self.max_entries <= 0 or size > self.max_bytes:
            return
        self._done[key] = (value, size)
        self.bytes += size
        while len(self._done) > self.max_entries or self.bytes > self.max_bytes:
            _, (_, old) = self._done.popitem(last=False)
            self.bytes -= old

    def stats(self) -> dict:
        with self._lock:
            return {"entries": len(self._done), "pinned": len(self._pinned), "bytes": self.bytes, "hits": self.hits,
                    "shared_in_flight": self.shared, "misses": self.misses, "in_flight": len(self._in_flight)}


def approx_bytes(obj, _depth: int = 0) -> int:
    """A result's memory, roughly: numpy buffers, strings and containers (a bound, not an audit)."""
    if _depth > 8:
        return 0
    if isinstance(obj, np.ndarray):
        return obj.nbytes + 112
    if isinstance(obj, str):
        return 50 + len(obj)
    if isinstance(obj, (int, float, bool)) or obj is None:
        return 28
    if isinstance(obj, dict):
        return 64 + sum(approx_bytes(k, _depth + 1) + approx_bytes(v, _depth + 1) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return 56 + 8 * len(obj) + sum(approx_bytes(v, _depth + 1) for v in obj)
    if dataclasses.is_dataclass(obj):
        return 64 + sum(approx_bytes(getattr(obj, f.name), _depth + 1) for f in dataclasses.fields(obj))
    return 64

"""Results of identical requests, computed once: a bounded LRU cache with in-flight sharing.

The key is everything that decides the answer (the model, the Jacobian lens's fingerprint, the
normalised request), built by the service. When the same link is opened by sixteen people at once,
the first request computes and the other fifteen wait for it (they never reach the engine); later
ones are served from memory until the entry is evicted. Bounded by entries and by bytes, both from
`Config` (`cache_entries`, `cache_mb`). Failures are never cached. A failure of the request itself (a bad
request, an engine that failed on it or timed out, is down or restarted under it) is shared with the waiters; one
that was the first asker's own (`THEIRS`: its rate or work budget, its turn at the engine or a busy engine's door, a
stream its reader left) is not: each waiter asks again as itself, with its own turn and budget, and gets its own
answer, never another's refusal worded as theirs.

A result is sized (`approx_bytes`) before the cache's lock is taken: every hit takes that lock, and sizing
a long readout used to hold it for 0.4 s (30 layers x 300 positions x top 100: 900k token strings walked).

Results computed or read with `pin=True` (an ask's wish: `asks.Ask.pin`) are kept apart and never evicted,
whatever the bounds: the front page's examples (`ui/front.py`), so a crowd of visitors never costs an engine
forward however many other links it opens.

The app's bounded maps are one shape: `cachetools.LRUCache` (here `BoundedLRU`, which adds a bound on entries
to its bound on size). Over its bound it lets go of the least recently used entry, and a value larger than the
whole bound is refused (ValueError) before anything is let go, so one huge result never empties the cache.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
from concurrent.futures import Future
from operator import itemgetter
from typing import Any, Callable, Hashable, Iterator, Sequence, TypeVar

import numpy as np
from cachetools import LRUCache

from ..engine.run.errors import EngineBusy
from .limits import RateLimited

T = TypeVar("T")
SAMPLED = 16        # a longer list (or dict, or object array) is sized from this many of its items, evenly spaced


class Abandoned(RuntimeError):
    """A streamed computation stopped by its reader: whoever waited for it computes its own."""


# Failures that were the first asker's, not the request's: a waiter computes its own instead. RateLimited: the
# asker's requests or work budget; EngineBusy: the asker's turn (its requests at the engine: turns.OverShare), or the
# engine's door full as it came (the waiter may find room); Abandoned: the asker left.
THEIRS = (Abandoned, RateLimited, EngineBusy)


class BoundedLRU(LRUCache):
    """cachetools' LRUCache, bounded by `maxsize` (in `getsizeof`'s units) and by `max_entries` (None: no bound
    on entries); counts what it lets go (`evicted`). A value over either bound raises ValueError and the entries
    already here stay. Not thread-safe: its owner holds a lock."""

    def __init__(self, maxsize: int, getsizeof: Callable[[Any], int] | None = None, max_entries: int | None = None):
        super().__init__(maxsize, getsizeof)
        self.max_entries = max_entries
        self.evicted = 0

    def __setitem__(self, key, value) -> None:
        if self.max_entries is not None and key not in self:
            # cachetools makes room for size only: room for one more entry is made here, once the value is known
            # to fit (checked first, so a refused value lets nothing go)
            if self.max_entries <= 0 or self.getsizeof(value) > self.maxsize:
                raise ValueError("value too large")
            while len(self) >= self.max_entries:
                self.popitem()
        super().__setitem__(key, value)

    def popitem(self):
        """The least recently used entry, let go to make room (cachetools calls it for nothing else)."""
        item = super().popitem()
        self.evicted += 1
        return item


class ResultCache:
    def __init__(self, max_entries: int, max_bytes: int, size: Callable[[Any], int] | None = None):
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self.size = approx_bytes if size is None else size
        # key -> (value, its size): sized before the lock is taken, so the cache reads the size it is handed
        self._done = BoundedLRU(max_bytes, getsizeof=itemgetter(1), max_entries=max_entries)
        self._in_flight: dict[Hashable, Future] = {}
        self._pinned: dict[Hashable, object] = {}
        self._lock = threading.Lock()
        self.hits = self.shared = self.misses = 0
        self.too_large = 0          # results not kept: larger than the whole bound

    def holds(self, key: Hashable, finished: bool = False) -> bool:
        """Whether `key`'s value is here (`finished`) or here or being computed (asking for it costs no new engine
        work)."""
        with self._lock:
            return key in self._pinned or key in self._done or (not finished and key in self._in_flight)

    def get_or_compute(self, key: Hashable, compute: Callable[[], T], pin: bool = False) -> T:
        return self.get_many([key], lambda todo: [compute()], pin)[0]

    def get_many(self, keys: list[Hashable], compute: Callable[[list[int]], list[T]], pin: bool = False) -> list[T]:
        """The value for each key: cached, shared with an identical request in flight, or computed by one
        call `compute(indices of the missing keys) -> their values`. `pin`: each value read or computed is kept
        for good, outside the bounds."""
        out: list = [None] * len(keys)
        waiting: dict[int, Future] = {}
        mine: dict[int, Future] = {}
        with self._lock:
            for i, key in enumerate(keys):
                if key in self._pinned:
                    self.hits += 1
                    out[i] = self._pinned[key]
                elif key in self._done:
                    self.hits += 1
                    out[i] = self._done[key][0]             # read: the most recently used now
                    if pin:                          # computed by a visitor first: pinned from now on
                        self._pinned[key] = self._done.pop(key)[0]
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
                sizes = [None if pin else self.size(value) for value in values]      # outside the lock: hits go on
            except BaseException as e:
                with self._lock:
                    for i in todo:
                        self._in_flight.pop(keys[i], None)
                for i in todo:
                    mine[i].set_exception(e)
                raise
            with self._lock:
                for i, value, size in zip(todo, values, sizes):
                    self._in_flight.pop(keys[i], None)
                    self.misses += 1
                    if pin:
                        self._pinned[keys[i]] = value
                    else:
                        self._store(keys[i], value, size)
            for i, value in zip(todo, values):
                out[i] = value
                mine[i].set_result(value)
        for i, future in waiting.items():
            try:
                out[i] = future.result()
            except THEIRS:                  # the first asker's refusal (or its reader left): asked again, as ours
                out[i] = self.get_many([keys[i]], lambda _, i=i: compute([i]), pin)[0]
        return out

    def streamed(self, key: Hashable, stream: Callable[[], Iterator]) -> Iterator:
        """`get_or_compute` for a computation that yields as it goes (a streamed generation): a value held is yielded
        alone, and so is one an identical request is computing (waited for); else `stream()`'s items are yielded as
        they come and its last is the value kept. Closed before its end (its reader left), it keeps nothing, and
        whoever was waiting for it computes its own (as for any failure that was its asker's own: THEIRS)."""
        value, theirs, mine = None, None, None
        with self._lock:
            if key in self._pinned or key in self._done:
                self.hits += 1
                value = self._pinned[key] if key in self._pinned else self._done[key][0]
            elif key in self._in_flight:
                self.shared += 1
                theirs = self._in_flight[key]
            else:
                mine = self._in_flight[key] = Future()
        if mine is not None:
            yield from self._stream_into(key, mine, stream)
            return
        if theirs is not None:
            try:
                value = theirs.result()
            except THEIRS:
                yield from self.streamed(key, stream)
                return
        yield value

    def _stream_into(self, key: Hashable, mine: Future, stream: Callable[[], Iterator]) -> Iterator:
        last, ended, items = None, False, None
        try:
            items = stream()
            for last in items:
                yield last
            ended = True
        finally:
            if not ended:                   # failed, or closed by its reader: nothing kept, the waiters told
                error = sys.exc_info()[1]
                try:
                    if hasattr(items, "close"):
                        items.close()       # now, not when collected: its work stopped and paid for first
                finally:
                    with self._lock:
                        self._in_flight.pop(key, None)
                    mine.set_exception(error if isinstance(error, Exception) else Abandoned("its reader left"))
        size = self.size(last)
        with self._lock:
            self._in_flight.pop(key, None)
            self.misses += 1
            self._store(key, last, size)
        mine.set_result(last)

    def _store(self, key: Hashable, value, size: int) -> None:
        if self.max_entries <= 0:           # the cache is off
            return
        try:
            self._done[key] = (value, size)
        except ValueError:                  # larger than the whole bound: not kept, the others stay
            self.too_large += 1

    def stats(self) -> dict:
        with self._lock:
            return {"entries": len(self._done), "pinned": len(self._pinned), "bytes": self._done.currsize,
                    "max_bytes": self.max_bytes, "hits": self.hits, "shared_in_flight": self.shared,
                    "misses": self.misses, "in_flight": len(self._in_flight), "evicted": self._done.evicted,
                    "too_large": self.too_large}


def approx_bytes(obj, _depth: int = 0) -> int:
    """A result's memory, roughly and from above (a bound, not an audit): numpy buffers by their nbytes, strings by
    their length, containers by their items. A list, dict or object array longer than SAMPLED is sized from SAMPLED
    of its items, evenly spaced, times its length: a result's long lists hold items alike (token strings, steps), so
    a 30 x 300 x 100 readout is sized from ~4k of its 900k token strings, within 1% of walking them all.

    A string is counted as its own object every time it appears, though a readout's tokens share one string per
    distinct token: for a 30 x 300 x 100 readout that is ~3.5x its memory measured (tracemalloc: 19 MB, this 69 MB),
    erring on the safe side."""
    if _depth > 8:
        return 0
    if isinstance(obj, np.ndarray):
        if obj.dtype == object:
            return obj.nbytes + 112 + _items_bytes(obj.ravel(), _depth)
        return obj.nbytes + 112
    if isinstance(obj, str):
        return 50 + len(obj)
    if isinstance(obj, (int, float, bool)) or obj is None:
        return 28
    if isinstance(obj, dict):
        return 64 + _items_bytes(list(obj), _depth) + _items_bytes(list(obj.values()), _depth)
    if isinstance(obj, (list, tuple)):
        return 56 + 8 * len(obj) + _items_bytes(obj, _depth)
    if dataclasses.is_dataclass(obj):
        return 64 + sum(approx_bytes(getattr(obj, f.name), _depth + 1) for f in dataclasses.fields(obj))
    return 64


def _items_bytes(items: Sequence, depth: int) -> int:
    """The items' bytes: each one's, or SAMPLED of them (the first, the last and evenly between) scaled to all."""
    n = len(items)
    if n <= SAMPLED:
        return sum(approx_bytes(v, depth + 1) for v in items)
    picked = sum(approx_bytes(items[i * (n - 1) // (SAMPLED - 1)], depth + 1) for i in range(SAMPLED))
    return picked * n // SAMPLED

"""The queue's JSON of a result answered again, made once per result object.

A shared link opened by thirty visitors, or one visitor replaying the heaviest request the app accepts, is
answered from the result cache: the same result object every time. Its JSON was made again for every answer,
and for a long prompt read at every layer with k 100 (a 26 MB answer) that cost the web process 1.2 CPU
seconds each time, most of it rounding floats (`results/export.round_floats`), while holding the interpreter's
lock that the engine's own loop needs too (bench/RESULTS.md, the workshop's run AB). Here the JSON is kept
beside the result, as bytes, while the result lives (a weak reference: when the result cache lets go of it,
its JSON goes too) and while it fits in `max_bytes` (least recently answered first out).

The bound is the app's one shape for bounded maps, `cachetools.LRUCache` sized by the JSON's length (a JSON
larger than the whole bound is refused, the others stay); the weak reference is the memo's own part: cachetools
holds its values strongly, so a freed result's entry is dropped here, at the next call.
"""

from __future__ import annotations

import threading
import weakref
from typing import Callable

from cachetools import LRUCache


class AnswerMemo:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.hits = self.misses = 0
        # id(result) -> (a weak reference to it, its JSON), bounded by the JSON's bytes
        self._kept: LRUCache[int, tuple[weakref.ref, bytes]] = LRUCache(max_bytes, getsizeof=lambda kept: len(kept[1]))
        self._gone: list[int] = []              # results freed since: their JSON dropped at the next call
        self._lock = threading.Lock()

    def json_of(self, result: object, make: Callable[[], bytes]) -> bytes:
        """`result`'s JSON: kept from an earlier answer, or `make()` now (and kept when it fits)."""
        key = id(result)
        with self._lock:
            self._sweep()
            kept = self._kept.get(key)          # a hit is the most recently answered now
            if kept is not None and kept[0]() is result:
                self.hits += 1
                return kept[1]
        data = make()
        try:
            # the callback may run inside any allocation, this lock held: it only notes the key
            ref = weakref.ref(result, lambda _, key=key: self._gone.append(key))
        except TypeError:                       # a result that cannot be referred to weakly: not kept
            ref = None
        with self._lock:
            self.misses += 1
            if ref is not None:
                self._keep(key, ref, data)
        return data

    @property
    def bytes(self) -> int:
        return self._kept.currsize

    def _keep(self, key: int, ref: weakref.ref, data: bytes) -> None:
        self._kept.pop(key, None)
        try:
            self._kept[key] = (ref, data)
        except ValueError:                      # larger than the whole bound: not kept, the others stay
            pass

    def _sweep(self) -> None:
        while self._gone:
            key = self._gone.pop()
            kept = self._kept.get(key)
            if kept is not None and kept[0]() is None:      # not a newer result at the same address
                del self._kept[key]

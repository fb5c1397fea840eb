"""The result cache: bounded by entries and bytes, identical requests in flight computed once, failures shared."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from lensapp.service.cache import ResultCache, approx_bytes


def test_identical_requests_in_flight_together_are_computed_once():
    cache, calls, gate = ResultCache(8, 1 << 20), [], threading.Event()

    def compute():
        calls.append(1)
        gate.wait(10)
        return "answer"

    results = []
    threads = [threading.Thread(target=lambda: results.append(cache.get_or_compute("k", compute)))
               for _ in range(16)]
    for t in threads:
        t.start()
    while cache.stats()["shared_in_flight"] < 15:
        time.sleep(0.01)
    gate.set()
    for t in threads:
        t.join(10)
    assert results == ["answer"] * 16 and len(calls) == 1
    assert cache.get_or_compute("k", lambda: "other") == "answer" and cache.stats()["hits"] == 1


def test_bounded_by_entries_and_bytes_least_recent_first():
    cache = ResultCache(max_entries=2, max_bytes=10_000)
    for key in "abc":
        cache.get_or_compute(key, lambda key=key: key * 10)
    assert cache.stats()["entries"] == 2
    assert cache.get_or_compute("a", lambda: "recomputed") == "recomputed"        # "a" was evicted first
    big = np.zeros(5_000)                                                          # 40 kB: over the byte bound
    assert cache.get_or_compute("big", lambda: big) is big and cache.stats()["entries"] <= 2
    assert all(approx_bytes(v) < 10_000 for v in ("a", "b"))


def test_many_keys_compute_the_missing_ones_in_one_call():
    cache, calls = ResultCache(8, 1 << 20), []
    cache.get_or_compute("a", lambda: "A")

    def compute(todo):
        calls.append(todo)
        return [f"v{i}" for i in todo]

    assert cache.get_many(["a", "b", "c", "b"], compute) == ["A", "v1", "v2", "v1"]
    assert calls == [[1, 2]]


def test_a_failure_is_shared_with_the_waiters_but_never_cached():
    cache = ResultCache(8, 1 << 20)
    with pytest.raises(RuntimeError):
        cache.get_or_compute("k", lambda: (_ for _ in ()).throw(RuntimeError("engine died")))
    assert cache.get_or_compute("k", lambda: "fine") == "fine"


def test_pinned_results_outlive_the_bounds_and_a_result_read_while_pinning_is_pinned():
    cache = ResultCache(max_entries=1, max_bytes=10_000)
    with cache.pinning():
        assert cache.get_or_compute("front", lambda: "F") == "F"
    cache.get_or_compute("seen", lambda: "S")                       # computed by a visitor first ...
    with cache.pinning():
        assert cache.get_or_compute("seen", lambda: "recomputed") == "S"     # ... pinned when read while pinning
    for key in "abc":                                               # a crowd of other links
        cache.get_or_compute(key, lambda key=key: key)
    assert cache.get_or_compute("front", lambda: "recomputed") == "F"
    assert cache.get_or_compute("seen", lambda: "recomputed") == "S"
    assert cache.stats()["pinned"] == 2 and cache.stats()["entries"] == 1

"""The result cache: bounded by entries and bytes, identical requests in flight computed once, failures of the request
shared, a first asker's own refusal not."""

from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np
import pytest

from lensapp.engine.run.errors import EngineBusy, EngineTimeout
from lensapp.results.lens import LensResult
from lensapp.results.readout import LensReadout, TargetScore
from lensapp.service.cache import BoundedLRU, ResultCache, approx_bytes
from lensapp.service.field import RequestError
from lensapp.service.limits import RateLimited


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


def test_the_bounded_map_refuses_a_value_over_its_bound_and_keeps_the_others():
    """The app's one shape of bounded map: least recently used out first, by size and by entries, and a value
    larger than the whole bound raises before anything is let go (the store never empties itself for it)."""
    lru = BoundedLRU(100, getsizeof=len, max_entries=3)
    for key in "abc":
        lru[key] = key * 30
    lru["a"]                                                        # read: "b" is now the least recently used
    with pytest.raises(ValueError):
        lru["huge"] = "h" * 101
    assert sorted(lru) == ["a", "b", "c"] and lru.currsize == 90 and lru.evicted == 0
    lru["d"] = "d" * 5                                              # a fourth entry: one goes, the least recent
    assert sorted(lru) == ["a", "c", "d"] and lru.evicted == 1
    lru["e"] = "e" * 70                                             # over the size bound: the least recent go
    assert sorted(lru) == ["d", "e"] and lru.currsize == 75 and lru.evicted == 3
    with pytest.raises(ValueError):
        BoundedLRU(100, max_entries=0)["x"] = "x"                   # no entries: nothing kept


def test_a_result_over_the_bound_is_not_kept_and_evicts_nothing():
    cache = ResultCache(max_entries=8, max_bytes=1000, size=len)
    for key in "abc":
        cache.get_or_compute(key, lambda key=key: key * 100)
    huge = "h" * 1001
    assert cache.get_or_compute("huge", lambda: huge) is huge      # answered, not kept
    stats = cache.stats()
    assert (stats["entries"], stats["bytes"], stats["evicted"], stats["too_large"]) == (3, 300, 0, 1)
    assert [cache.get_or_compute(key, lambda: "recomputed") for key in "abc"] == ["a" * 100, "b" * 100, "c" * 100]
    assert cache.get_or_compute("huge", lambda: "recomputed") == "recomputed"
    for key in "defghij":                                           # eight entries at most: the three oldest go
        cache.get_or_compute(key, lambda key=key: key * 100)
    stats = cache.stats()
    assert (stats["entries"], stats["bytes"], stats["evicted"]) == (8, 10 + 700, 3)
    assert cache.get_or_compute("huge", lambda: "again") == "recomputed"
    assert cache.get_or_compute("a", lambda: "again") == "again"


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


def joined_after(first_fails: BaseException, streamed: bool) -> tuple[object, object]:
    """Two identical requests: the first's computation fails with `first_fails` once the second has joined it.
    (what the first was answered, what the second was answered)."""
    cache, gate, out = ResultCache(8, 1 << 20), threading.Event(), {}

    def first():
        gate.wait(10)
        raise first_fails

    def ask(name, compute):
        try:
            out[name] = (list(cache.streamed("k", lambda: iter([compute()])))[-1] if streamed else
                         cache.get_or_compute("k", compute))
        except Exception as e:  # noqa: BLE001 - what each asker was answered
            out[name] = e

    threads = [threading.Thread(target=ask, args=("first", first)),
               threading.Thread(target=ask, args=("second", lambda: "the second's own"))]
    threads[0].start()
    while cache.stats()["in_flight"] == 0:
        time.sleep(0.001)
    threads[1].start()
    while cache.stats()["shared_in_flight"] == 0:
        time.sleep(0.001)
    gate.set()
    for t in threads:
        t.join(10)
    return out["first"], out["second"]


@pytest.mark.parametrize("streamed", [False, True], ids=["one-shot", "streamed"])
@pytest.mark.parametrize("refusal", [RateLimited("too much work from your address for now; try again in 9 s"),
                                     EngineBusy("you already have 4 requests running or waiting here")],
                         ids=["its-budget", "its-turn"])
def test_a_waiter_is_asked_again_as_itself_when_the_first_asker_was_refused_for_its_own_reasons(refusal, streamed):
    """The first asker's rate, budget or turn refused it: the waiter is not handed that refusal (worded "from your
    address"), it computes its own answer. Before, only a stream abandoned by its reader was asked again."""
    first, second = joined_after(refusal, streamed)
    assert first is refusal and second == "the second's own"


@pytest.mark.parametrize("failure", [RequestError("this request costs 30,000 units of work"),
                                     EngineTimeout("the request took longer than its 120 s and was cancelled"),
                                     RuntimeError("engine died")], ids=["bad-request", "timed-out", "fault"])
def test_a_failure_of_the_request_itself_is_shared_with_its_waiter(failure):
    first, second = joined_after(failure, streamed=False)
    assert first is failure and second is failure


def test_pinned_results_outlive_the_bounds_and_a_result_read_while_pinning_is_pinned():
    cache = ResultCache(max_entries=1, max_bytes=10_000)
    assert cache.get_or_compute("front", lambda: "F", pin=True) == "F"
    cache.get_or_compute("seen", lambda: "S")                       # computed by a visitor first ...
    assert cache.get_or_compute("seen", lambda: "recomputed", pin=True) == "S"     # ... pinned when read pinning
    for key in "abc":                                               # a crowd of other links
        cache.get_or_compute(key, lambda key=key: key)
    assert cache.get_or_compute("front", lambda: "recomputed") == "F"
    assert cache.get_or_compute("seen", lambda: "recomputed") == "S"
    assert cache.stats()["pinned"] == 2 and cache.stats()["entries"] == 1


def test_a_hit_is_served_while_another_result_is_being_sized():
    sizing, release = threading.Event(), threading.Event()

    def size(value):
        if value == "long readout":                     # sizing it takes a while: a hit must not wait for it
            sizing.set()
            release.wait(10)
        return 100

    cache = ResultCache(8, 1 << 20, size=size)
    cache.get_or_compute("seen", lambda: "short readout")
    storing = threading.Thread(target=cache.get_or_compute, args=("new", lambda: "long readout"))
    storing.start()
    try:
        assert sizing.wait(10)
        heard = []
        hit = threading.Thread(target=lambda: heard.append(cache.get_or_compute("seen", lambda: "recomputed")))
        hit.start()
        hit.join(2)
        assert heard == ["short readout"]               # served while the other was still being sized
    finally:
        release.set()
        storing.join(10)
    assert cache.get_or_compute("new", lambda: "recomputed") == "long readout" and cache.stats()["bytes"] == 200


def walked(obj, depth: int = 0) -> int:
    """The reference: every item walked (what approx_bytes did before it sampled long lists)."""
    if depth > 8:
        return 0
    if isinstance(obj, np.ndarray):
        return obj.nbytes + 112
    if isinstance(obj, str):
        return 50 + len(obj)
    if isinstance(obj, (int, float, bool)) or obj is None:
        return 28
    if isinstance(obj, dict):
        return 64 + sum(walked(k, depth + 1) + walked(v, depth + 1) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return 56 + 8 * len(obj) + sum(walked(v, depth + 1) for v in obj)
    if dataclasses.is_dataclass(obj):
        return 64 + sum(walked(getattr(obj, f.name), depth + 1) for f in dataclasses.fields(obj))
    return 64


def long_readout(L: int = 30, P: int = 300, k: int = 50) -> LensResult:
    """A long prompt's readout, its tokens (1-12 characters) shared from one vocabulary as `from_readout` makes them."""
    rng = np.random.default_rng(0)
    vocab = ["".join(chr(97 + int(c)) for c in rng.integers(0, 26, 1 + i % 12)) for i in range(5000)]
    ids = rng.integers(0, len(vocab), (L, P, k))
    readout = LensReadout(top_ids=ids, top_probs=rng.random((L, P, k), dtype=np.float32),
                          top_tokens=[[[vocab[i] for i in pos] for pos in layer] for layer in ids.tolist()],
                          entropy=np.zeros((L, P), np.float32), kl_to_final=np.zeros((L, P), np.float32),
                          targets=[TargetScore("Paris", [7], ["Paris"], np.zeros((L, P)), np.ones((L, P), int))],
                          decided_tokens=vocab[:P])
    return LensResult(prompt="word " * P, input_ids=list(range(P)), input_tokens=vocab[:P], layers=list(range(L)),
                      lenses={"logit": readout}, model_next_id=1, model_next_token="a")


def test_a_long_readout_is_sized_from_a_sample_close_to_walking_it_all_and_far_sooner():
    result = long_readout()
    t = time.perf_counter()
    walk = walked(result)
    walk_seconds = time.perf_counter() - t
    seconds = []
    for _ in range(3):
        t = time.perf_counter()
        estimate = approx_bytes(result)
        seconds.append(time.perf_counter() - t)
    assert 0.95 < estimate / walk < 1.05, (estimate, walk)
    assert min(seconds) < walk_seconds / 10, (seconds, walk_seconds)
    assert approx_bytes(np.array(["token"] * 1000, dtype=object)) >= 1000 * (8 + 50 + 5)     # its strings count too

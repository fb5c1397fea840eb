"""The supervisor and the turns on a stand-in backend: what each caller hears when the backend dies under
them, when it stalls, when a request is long, and who runs next when several clients ask at once.

The real-engine version (SIGKILL to vLLM's EngineCore under load) is in `test_serving.py`; this one
pins the race it found: one request caught mid-submission never hears of the death, and must be
told at once rather than at its deadline."""

import asyncio
import threading
import time

import pytest

from lensapp.engine.run.core import Engine
from lensapp.engine.run.parts import Part
from lensapp.engine.run.protocol import ModelInfo, Progress

INFO = ModelInfo(name="stand-in", n_layers=2, d_model=4, vocab_size=8, backend="vllm-cpu", device="cpu",
                 dtype="float32")


class DeadError(RuntimeError):
    pass


class StandIn:
    """Runs `fn` as asked; `die()` makes failure() report death, as a vLLM whose EngineCore exited."""

    concurrent = True

    def __init__(self, n: int):
        self.n, self.dead, self.steps, self.cpu = n, False, 0, 0.0

    def failure(self):
        return "its process died" if self.dead else None

    def progress(self):
        return Progress(self.steps, self.cpu)

    def is_dead(self, error):
        return "its process died" if isinstance(error, DeadError) else None

    def close(self):
        pass


class LooksFailAtFirst(StandIn):
    """A StandIn whose `looked` method (progress or failure) raises its first three times asked, then answers."""

    def __init__(self, n: int, looked: str):
        super().__init__(n)
        self.looked, self.raised = looked, 0

    def failure(self):
        self._maybe_raise("failure")
        return super().failure()

    def progress(self):
        self._maybe_raise("progress")
        return super().progress()

    def _maybe_raise(self, name: str) -> None:
        if name == self.looked and self.raised < 3:
            self.raised += 1
            raise RuntimeError(f"{name} could not be read")


def make_engine(backend=StandIn, **settings):
    backends = []

    def start():
        backends.append(backend(len(backends)))
        return backends[-1]

    e = Engine(start, INFO, **{"request_timeout": 60, "watchdog_seconds": 60, **settings})
    e.wait_ready(10)
    return e, backends


@pytest.fixture
def engine():
    e, backends = make_engine()
    yield e, backends
    e.close()


def test_a_request_that_never_hears_of_the_death_is_told_at_once(engine):
    e, backends = engine
    heard = {}

    async def hangs(backend):
        await asyncio.Event().wait()             # an output that never comes

    async def fails(backend):
        await asyncio.sleep(0.3)
        backend.dead = True
        raise DeadError("the engine process died")

    def ask(name, fn):
        t = time.perf_counter()
        try:
            e.call("generate", fn)
            heard[name] = ("answered", time.perf_counter() - t)
        except Exception as err:  # noqa: BLE001 - what the caller hears is the point
            heard[name] = (str(err), time.perf_counter() - t)

    threads = [threading.Thread(target=ask, args=(n, f)) for n, f in (("hangs", hangs), ("fails", fails))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert heard["fails"][0] == "the model restarted; please run again"
    assert heard["hangs"][0] == "the model restarted; please run again"
    assert heard["hangs"][1] < 5, heard                  # not its 60 s deadline
    e.wait_ready(10)
    assert len(backends) == 2 and e.health()["restarts"] == 1

    async def answers(backend):
        return backend.n

    assert e.call("lens", answers) == 1                  # the new backend serves



def ask(e, fn, client=None, **kw):
    """What a caller hears: ("answered", result) or ("error", message)."""
    try:
        return "answered", e.call("lens", fn, client=client, **kw)
    except Exception as err:  # noqa: BLE001 - what the caller hears is the point
        return "error", str(err)


def test_a_long_request_that_keeps_stepping_is_not_a_stuck_engine():
    """Ten seconds of work, its steps finishing every 0.2 s, against a stall limit of 1 s: no restart."""
    e, backends = make_engine(stall_timeout=1.0, watchdog_seconds=0.2)
    try:
        async def long(backend):
            for _ in range(20):
                await asyncio.sleep(0.2)
                backend.steps += 1
            return "done"

        assert ask(e, long) == ("answered", "done")
        assert len(backends) == 1 and e.health()["restarts"] == 0
    finally:
        e.close()


def test_one_long_step_with_busy_processes_is_not_a_stuck_engine_up_to_the_ceiling():
    """Four seconds without a step but with CPU time spent (a crowded step) against a stall limit of 1 s: no
    restart; a busy engine that never steps is restarted at STALL_CEILING times the limit."""
    e, backends = make_engine(stall_timeout=1.0, watchdog_seconds=0.2)
    try:
        async def long_step(backend):
            for _ in range(20):
                await asyncio.sleep(0.2)
                backend.cpu += 1.0
            backend.steps += 1
            return "done"

        assert ask(e, long_step) == ("answered", "done")
        assert len(backends) == 1

        async def spins(backend):
            while True:
                await asyncio.sleep(0.2)
                backend.cpu += 1.0

        t = time.perf_counter()
        heard = ask(e, spins)
        assert heard[0] == "error" and "restarted" in heard[1] and 4 < time.perf_counter() - t < 20
        assert "no engine step finished in" in e.reason
    finally:
        e.close()


def test_an_engine_that_stops_stepping_is_restarted_and_its_callers_told():
    e, backends = make_engine(stall_timeout=1.0, watchdog_seconds=0.2)
    try:
        async def stuck(backend):
            await asyncio.Event().wait()

        t = time.perf_counter()
        heard = ask(e, stuck)
        assert heard[0] == "error" and "restarted" in heard[1] and time.perf_counter() - t < 10
        e.wait_ready(10)
        assert len(backends) == 2 and e.health()["restarts"] == 1
        assert "no engine step finished and its processes were idle" in e.reason
    finally:
        e.close()


@pytest.mark.parametrize("looked", ["progress", "failure"])
def test_the_watchdog_outlives_a_failed_look_and_still_restarts_a_stuck_engine(looked, caplog):
    e, backends = make_engine(lambda n: LooksFailAtFirst(n, looked), stall_timeout=1.0, watchdog_seconds=0.2)
    try:
        deadline = time.monotonic() + 10
        while backends[0].raised < 3 and time.monotonic() < deadline:        # its first looks failed
            time.sleep(0.05)
        assert backends[0].raised == 3

        async def stuck(backend):
            await asyncio.Event().wait()

        heard = ask(e, stuck, timeout=15)
        assert heard[0] == "error" and "restarted" in heard[1], heard      # not its deadline: the watch went on
        e.wait_ready(10)
        assert len(backends) == 2 and e.health()["restarts"] == 1
        failed = [r for r in caplog.records if "watchdog's look at the backend failed" in r.getMessage()]
        assert len(failed) == 1                                             # three failures, logged once
    finally:
        e.close()


def test_a_deadline_cancels_that_request_alone():
    e, backends = make_engine(stall_timeout=60, watchdog_seconds=0.2)
    try:
        async def slow(backend):
            for _ in range(100):
                await asyncio.sleep(0.1)
                backend.steps += 1

        async def quick(backend):
            return "quick"

        heard = ask(e, slow, timeout=1.0)
        assert heard[0] == "error" and "longer than its 1 s" in heard[1]
        assert ask(e, quick) == ("answered", "quick")
        assert len(backends) == 1 and e.health()["calls"]["timed_out"] == 1
    finally:
        e.close()


def test_a_client_over_its_share_is_told_at_once():
    e, _ = make_engine(per_client=2, parts_per_client=1)
    release = threading.Event()
    try:
        async def waits(backend):
            while not release.is_set():
                await asyncio.sleep(0.05)
            return "ok"

        threads = [threading.Thread(target=ask, args=(e, waits, "10.0.0.1")) for _ in range(2)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 5
        while e.health()["admitted"] < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        t0 = time.perf_counter()
        heard = ask(e, waits, "10.0.0.1")
        assert heard[0] == "error" and "you already have 2 requests" in heard[1] and time.perf_counter() - t0 < 1
        release.set()
        assert ask(e, waits, "10.0.0.2") == ("answered", "ok")          # another client is not held up
        assert ask(e, waits, None) == ("answered", "ok")                # nor the host
        for t in threads:
            t.join(10)
    finally:
        release.set()
        e.close()


def test_parts_take_turns_round_robin_over_clients():
    """One client's sweep of eight parts and another's single part, on two slots: the second client's part is
    granted at the first free slot, not after the sweep."""
    e, _ = make_engine(max_batch=2, parts_per_client=2)
    order, gate = [], threading.Event()
    try:
        def part(name):
            async def run(backend):
                order.append(name)
                while not gate.is_set():
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.05)
                return name
            return run

        def sweep():
            e.run("lens", [Part(part(f"sweep{i}")) for i in range(8)], client="10.0.0.1")

        t = threading.Thread(target=sweep)
        t.start()
        deadline = time.monotonic() + 5
        while len(order) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        other = threading.Thread(target=ask, args=(e, part("other"), "10.0.0.2"))
        other.start()
        time.sleep(0.2)
        gate.set()
        t.join(10)
        other.join(10)
        assert order[:2] == ["sweep0", "sweep1"] and order[2] == "other", order
    finally:
        gate.set()
        e.close()

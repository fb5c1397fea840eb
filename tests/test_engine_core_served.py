"""The supervisor on a stand-in served backend: an engine service that goes away is waited for, as often and
as long as it is away, and never takes the engine down (the real service: test_engine_service.py)."""

import asyncio
import time

import pytest

from lensapp.engine.run.core import Engine
from lensapp.engine.run.protocol import ModelInfo, Progress, Unreachable

INFO = ModelInfo(name="stand-in", n_layers=2, d_model=4, vocab_size=8, backend="vllm-serve", device="remote",
                 dtype="float32")


class Service:
    """What the stand-in backends talk to: up or away."""

    def __init__(self, up: bool):
        self.up, self.connects, self.tries = up, 0, 0
        self.answers, self.cpu_seconds = 0, 0.0      # what RemoteBackend.progress reports: answers, its CPU time


class ServedStandIn:
    concurrent = True
    served = True

    def __init__(self, service: Service):
        service.tries += 1
        if not service.up:
            raise Unreachable("the engine service at stand-in does not answer", retry_after=0.05)
        service.connects += 1
        self.service, self.n = service, service.connects

    def failure(self):
        return None if self.service.up else "the engine service at stand-in does not answer"

    def progress(self):
        return Progress(self.service.answers, self.service.cpu_seconds)

    def is_dead(self, error):
        return str(error) if isinstance(error, Unreachable) else None

    def close(self):
        pass


def until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.fixture
def served():
    service = Service(up=False)
    engine = Engine(lambda: ServedStandIn(service), INFO, max_restarts=2, request_timeout=30, watchdog_seconds=0.05)
    engine.start()
    yield engine, service
    engine.close()


async def which(backend):
    return backend.n


def test_a_service_away_at_start_is_waited_for_and_said(served):
    engine, service = served
    from lensapp.ui.status import status_line

    until(lambda: "does not answer" in engine.health()["reason"])
    assert engine.health()["state"] == "starting"
    assert "does not answer" in status_line(engine.health())          # the page's banner says why it waits
    time.sleep(0.5)
    assert engine.health()["state"] == "starting" and service.tries >= 5     # tried every retry_after, not down
    service.up = True
    engine.wait_ready(10)
    assert engine.call("lens", which) == 1


def test_a_service_lost_more_often_than_max_restarts_is_waited_for_every_time(served):
    engine, service = served
    service.up = True
    engine.wait_ready(10)
    for round_ in range(1, 5):                               # max_restarts is 2: a local backend would be down
        service.up = False
        until(lambda: engine.health()["state"] == "restarting")
        assert "does not answer" in engine.health()["reason"]
        with pytest.raises(Exception, match="took longer"):
            engine.request_timeout = 0.3                     # a call while it is away waits, up to its deadline
            engine.call("lens", which)
        engine.request_timeout = 30
        service.up = True
        engine.wait_ready(10)
        assert engine.call("lens", which) == round_ + 1      # a new connection each time
    h = engine.health()
    assert h["state"] == "ready" and h["restarts"] == 0


def test_a_call_cut_off_by_the_service_going_away_is_told_to_run_again(served):
    engine, service = served
    service.up = True
    engine.wait_ready(10)

    async def cut(backend):
        await asyncio.sleep(0.1)
        backend.service.up = False
        raise Unreachable("the engine service at stand-in does not answer (ReadError)")

    with pytest.raises(Exception, match="please run again"):
        engine.call("lens", cut)
    service.up = True
    engine.wait_ready(10)
    assert engine.call("lens", which) == 2


def test_a_long_answer_from_a_working_service_is_awaited_and_a_silent_idle_one_reconnected():
    """The stall watch on a served backend (RemoteBackend.progress: answers received, the service's CPU time):
    a trace that takes longer than stall_timeout on a service whose vLLM keeps working is no stall; one on a
    service that neither answers nor works is, and the engine reconnects (not a restart it counts)."""
    service = Service(up=True)
    engine = Engine(lambda: ServedStandIn(service), INFO, request_timeout=30, stall_timeout=0.4,
                    watchdog_seconds=0.05)
    engine.start()
    try:
        engine.wait_ready(10)

        async def working(backend):
            for _ in range(12):                      # 1.2 s, three stall_timeouts, no answer until the end
                await asyncio.sleep(0.1)
                backend.service.cpu_seconds += 1.0
            backend.service.answers += 1
            return backend.n

        assert engine.call("lens", working) == 1

        async def silent(backend):
            await asyncio.sleep(5)
            return backend.n

        with pytest.raises(Exception, match="please run again"):
            engine.call("lens", silent)
        engine.wait_ready(10)
        assert engine.call("lens", which) == 2 and engine.health()["restarts"] == 0
    finally:
        engine.close()

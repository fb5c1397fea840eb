"""The supervisor on a stand-in backend: what each caller hears when the backend dies under them.

The real-engine version (SIGKILL to vLLM's EngineCore under load) is in `test_serving.py`; this one
pins the race it found: one request caught mid-submission never hears of the death, and must be
told at once rather than at its deadline."""

import asyncio
import threading
import time

import pytest

from lensapp.engine.core import Engine
from lensapp.engine.protocol import ModelInfo

INFO = ModelInfo(name="stand-in", n_layers=2, d_model=4, vocab_size=8, backend="vllm-cpu", device="cpu",
                 dtype="float32")


class DeadError(RuntimeError):
    pass


class StandIn:
    """Runs `fn` as asked; `die()` makes failure() report death, as a vLLM whose EngineCore exited."""

    concurrent = True

    def __init__(self, n: int):
        self.n, self.dead = n, False

    def failure(self):
        return "its process died" if self.dead else None

    def is_dead(self, error):
        return "its process died" if isinstance(error, DeadError) else None

    def close(self):
        pass


@pytest.fixture
def engine():
    backends = []

    def start():
        backends.append(StandIn(len(backends)))
        return backends[-1]

    e = Engine(start, INFO, request_timeout=60, watchdog_seconds=60)
    e.wait_ready(10)
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


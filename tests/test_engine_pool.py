"""The pool of engine services (engine/run/engines.py) without an engine: stand-ins for nnsight-serve behind the
engine's own door (`engine_service.guarded`: the key and the full engine's 429), each answering a trace after a
short wait. Which engine a request goes to, a full one passed over at once, a gone one left out with its request
asked elsewhere, taken back (and admitted) once it answers, and `Unreachable` only when none is up. The same with
vLLM engines: tests/test_engines.py. About 10 s."""

import asyncio
import io
import secrets
import socket
import threading
import time
from types import SimpleNamespace

import pytest
import torch
from test_engine_trust import SAVES

from lensapp import engine_service
from lensapp.engine.run.engines import Engines
from lensapp.engine.run.protocol import Sampling, StartFailed, Unreachable
from lensapp.engine.run.remote_backend import seeded
from lensapp.engine.run.served import PROGRESS_PATH, TRACE_PATH

KEY = secrets.token_urlsafe(32)
LIMIT = 2                  # each stand-in is full at two traces in flight
ANSWER_S = 0.4             # each trace takes this long


def stand_in_app():
    from fastapi import FastAPI, Request, Response

    app = FastAPI()

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.post(TRACE_PATH)
    async def generate(request: Request) -> Response:
        await request.body()
        await asyncio.sleep(ANSWER_S)
        buffer = io.BytesIO()
        torch.save({"saves": SAVES[b"a lens"], "error": None}, buffer)
        return Response(content=buffer.getvalue(), media_type="application/octet-stream")

    @app.get(PROGRESS_PATH)
    async def progress() -> dict:
        return {"cpu_seconds": 1.5}

    return app


class StandIn:
    """A stand-in engine service on a fixed loopback port: `stop()` it (gone: connections refused), `start()` again."""

    def __init__(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.start()

    def start(self) -> None:
        import uvicorn

        sock = socket.create_server(("127.0.0.1", self.port))
        self.server = uvicorn.Server(uvicorn.Config(engine_service.guarded(stand_in_app(), KEY, LIMIT),
                                                    log_level="critical"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the stand-in did not start"
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = self.server.force_exit = True
        self.thread.join(10)


@pytest.fixture(scope="module")
def services():
    import anyio._backends._asyncio  # noqa: F401 - imported once here: two servers' threads importing it at once race
    started = [StandIn(), StandIn()]
    yield started
    for s in started:
        s.stop()


@pytest.fixture
def pool(services, monkeypatch):
    from lensapp.engine.run import engines

    monkeypatch.setattr(engines, "POLL_SECONDS", 0.2)
    admitted = []
    pool = Engines.of([s.url for s in services], KEY)
    pool.admit_all(lambda wire: admitted.append(wire.url))
    pool.watch(lambda wire: admitted.append(wire.url))
    yield SimpleNamespace(pool=pool, admitted=admitted)
    pool.stop()


def asked(pool: Engines, n: int, during=None) -> tuple[float, list]:
    """`n` traces at once through the pool: the wall time, and each one's answer or error."""
    async def go():
        async with pool.async_client() as client:
            tasks = [asyncio.ensure_future(pool.apost(client, b"a lens")) for _ in range(n)]
            if during is not None:
                await asyncio.sleep(ANSWER_S / 2)
                during()
            return await asyncio.gather(*tasks, return_exceptions=True)
    t = time.perf_counter()
    answers = asyncio.run(go())
    return time.perf_counter() - t, answers


def counts(pool: Engines, key: str) -> list:
    return [e[key] for e in pool.describe()]


def test_requests_go_to_the_least_loaded_then_a_full_engine_sends_them_on_at_once(pool, services):
    p = pool.pool
    assert pool.admitted == [s.url for s in services] and counts(p, "up") == [True, True]
    _, answers = asked(p, 4)                           # two each: neither full
    assert not [a for a in answers if isinstance(a, BaseException)]
    assert counts(p, "answered") == [2, 2] and counts(p, "busy") == [0, 0]
    _, answers = asked(p, 6)           # more than both hold: each extra one told "full", then sent to wait
    assert not [a for a in answers if isinstance(a, BaseException)]
    assert sum(counts(p, "busy")) >= 2 and sum(counts(p, "answered")) == 10 and counts(p, "in_flight") == [0, 0]
    assert p.progress() == 3.0                         # each one's CPU time, summed (read when admitted)


def test_a_gone_engine_is_left_out_its_requests_answered_elsewhere_and_taken_back(pool, services):
    p, (a, b) = pool.pool, services
    _, answers = asked(p, 4, during=a.stop)
    assert not [x for x in answers if isinstance(x, BaseException)], answers
    engines = p.describe()
    assert not engines[0]["up"] and engines[0]["failed_over"] >= 2 and "does not answer" in engines[0]["reason"]
    assert engines[1]["up"] and engines[1]["answered"] == 4 and p.failure() is None
    assert "127.0.0.1" in engines[0]["url"] and KEY not in str(engines)
    a.start()
    deadline = time.monotonic() + 10
    while not p.describe()[0]["up"]:                   # its watcher looks, admits it, and lets it in
        assert time.monotonic() < deadline, p.describe()
        time.sleep(0.05)
    assert pool.admitted.count(a.url) == 2
    asked(p, 2)
    assert counts(p, "answered") == [1, 5]              # one each: it serves again
    p.grace_s = 0.5                                    # none up this long: the page's engine is gone
    b.stop()
    a.stop()
    deadline = time.monotonic() + 10
    while p.failure() is None:
        assert time.monotonic() < deadline, p.describe()
        time.sleep(0.05)
    assert "no engine service answers" in p.failure()
    _, answers = asked(p, 1)
    assert isinstance(answers[0], Unreachable) and "no engine service answers" in str(answers[0])
    a.start()
    b.start()


def test_an_engine_that_refuses_the_page_stays_out(services):
    def refuse_the_first(wire):
        if wire.url == services[0].url:
            raise StartFailed("the engine service serves another model: n_layers 3 (the page: 30)")
    pool = Engines.of([s.url for s in services], KEY)
    refusals = pool.admit_all(refuse_the_first)
    assert isinstance(refusals[0], StartFailed) and refusals[1] is None
    assert counts(pool, "up") == [False, True] and "another model" in pool.describe()[0]["reason"]
    asked(pool, 2)
    assert counts(pool, "answered") == [0, 2]


def test_an_unseeded_sample_is_given_its_seed_before_it_is_sent():
    assert seeded(Sampling(8)) == Sampling(8) and seeded(Sampling(8, 0.8, 3)) == Sampling(8, 0.8, 3)
    drawn = {seeded(Sampling(8, 0.8)).seed for _ in range(4)}
    assert None not in drawn and len(drawn) > 1


def test_a_stream_moves_before_its_first_frame_and_not_after(pool, services):
    p, a = pool.pool, services[0]

    def frames(cut_after_first: bool):
        async def open_stream(wire, fail_if_busy):
            async with wire.async_client() as client:
                yield await wire.apost(client, b"a lens", fail_if_busy)      # the first frame: the engine answered
                if cut_after_first:
                    raise Unreachable(f"the engine service at {wire.url} does not answer (cut)")
                yield "the last frame"
        return open_stream

    async def read(cut_after_first: bool):
        return [f async for f in p.stream(frames(cut_after_first))]

    a.stop()                                           # gone, not yet noticed: the stream is asked there first
    try:
        got = asyncio.run(read(False))
        assert len(got) == 2 and got[1] == "the last frame"
        assert counts(p, "failed_over") == [1, 0] and counts(p, "answered") == [0, 1]
        assert counts(p, "up") == [False, True]
    finally:
        a.start()
    with pytest.raises(Unreachable, match="cut"):      # past its first frame: the caller's error, moved nowhere
        asyncio.run(read(True))
    assert counts(p, "failed_over") == [1, 0] and counts(p, "in_flight") == [0, 0]


def test_a_trace_that_lost_the_only_address_waits_for_it_and_the_page_is_not_told_it_is_gone(services):
    """One address may front many replicas (Ray Serve's proxy): a trace whose replica died there is answered once the
    address answers again, within GRACE_S, and meanwhile the page's engine is not `failure()`: no restart."""
    from lensapp.engine.run import engines

    a = services[0]
    pool = Engines.of([a.url], KEY)
    pool.admit_all(lambda wire: None)
    pool.watch(lambda wire: None)
    failures = []
    try:
        a.stop()

        def back_soon():
            time.sleep(3 * engines.POLL_SECONDS)   # its watcher has looked and left it out meanwhile
            failures.append(pool.failure())
            a.start()
        threading.Thread(target=back_soon, daemon=True).start()
        _, answers = asked(pool, 2)
        assert not [x for x in answers if isinstance(x, BaseException)], answers
        assert failures == [None] and pool.describe()[0]["failed_over"] >= 1 and pool.failure() is None
    finally:
        pool.stop()

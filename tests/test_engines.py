"""One page on two engine services (`--engine-url A,B`: engine/run/engines.py): the in-process answers, requests
spread over both, a full engine passed over at once (its 429), and one engine killed under load with nothing lost,
then started again and given the page's Jacobian lens before it serves.

Two `lensapp engine` services for the module, started together (each loads while the other does, and while the
session's in-process reference starts), both without a lens of their own: the page installs its lens on each,
and again on the one that comes back. Cost on this 2-core machine, run alone beside other sessions' work: 195 s and
216 s (setup 89-120 s: the two engines and the session's in-process reference, which a whole run shares; the kill
test 56-61 s, most of it the engine's second start; teardown ~30 s); the other two tests ~10 s together."""

import os
import signal
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
import test_engine_service
from conftest import CACHE, _free_port
from test_engine_service import GENERATE, KEY, LENS, assert_same_json, assert_same_lens, gone_with, until_ready

from lensapp.service import GenerateRequest, LensRequest

pytestmark = pytest.mark.engine

MAX_BATCH = 2                   # each engine's limit: full at two traces in flight
LONG = GenerateRequest(prompt="Once upon a time", max_tokens=24, temperature=0.8, seed=11, lens="both", k=3)


def start_engine(port: int, log_path) -> subprocess.Popen:
    """`lensapp engine` without a lens of its own, full at MAX_BATCH, in its own process group (killed whole with
    SIGKILL below)."""
    return test_engine_service.start_engine(port, "none", log_path, "--max-batch", str(MAX_BATCH))


lens_file = test_engine_service.lens_file          # the random lens, and the in-process service with it
reference = test_engine_service.reference


@pytest.fixture(scope="module")
def engines(tmp_path_factory, embedded_dir):
    logs = tmp_path_factory.mktemp("engines-log")
    started = []
    for name in "ab":
        port, log = _free_port(), logs / f"engine-{name}.log"
        started.append(SimpleNamespace(port=port, url=f"http://127.0.0.1:{port}", log=log, starts=1,
                                       proc=start_engine(port, log)))
    yield started
    for engine in started:
        if engine.proc.poll() is None:
            gone_with(engine.proc)


@pytest.fixture(scope="module")
def page(engines, lens_file, reference):
    from lensapp import config
    from lensapp.service import LensService

    for engine in engines:
        until_ready(engine.proc, engine.log)
    service = LensService.start(config.Config.of(engine_url=",".join(e.url for e in engines), engine_key=KEY,
                                                 jlens=str(lens_file), cache_entries=0, cache_dir=str(CACHE)))
    service.wait_ready(300)
    yield service
    service.close()


def pool(page) -> list[dict]:
    return page.health()["engines"]


def post(url: str, fail_if_busy: bool) -> int:
    """test_engine_service's bad trace with the key, marked to be answered 429 when the engine is full."""
    return test_engine_service.post(url, KEY, **({"lensapp-fail-if-busy": "1"} if fail_if_busy else {}))


def hold(port: int, n: int) -> list[socket.socket]:
    """`n` traces in flight on the engine at `port` that never finish sending: it is full while they are open."""
    held = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(f"POST /v1/nnsight/generate HTTP/1.1\r\nHost: 127.0.0.1\r\nndif-api-key: {KEY}\r\n"
                  "Content-Type: application/octet-stream\r\nContent-Length: 1000\r\n\r\n".encode())
        held.append(s)
    return held


def test_the_pool_answers_as_in_process_and_spreads_over_both_engines(page, reference, engines):
    h = page.health()
    assert h["backend"] == "vllm-serve" and [e["url"] for e in h["engines"]] == [e.url for e in engines]
    assert all(e["up"] for e in h["engines"]) and page.jlens_layers == reference.jlens_layers
    want = reference.lens(LENS)
    for a, b in zip(page.lens(LENS), want):
        assert set(b.lenses) == {"logit", "jacobian"}       # the page's lens, installed on both engines
        assert_same_lens(a, b)
    a, b = page.generate(GENERATE), reference.generate(GENERATE)
    assert a.token_ids == b.token_ids and a.text == b.text
    assert_same_json(a.to_json(), b.to_json())
    before = [e["answered"] for e in pool(page)]
    with ThreadPoolExecutor(4) as threads:            # four at once: two on each engine (the fewest in flight)
        for got in threads.map(lambda _: page.lens(LENS), range(4)):
            for x, y in zip(got, want):
                assert_same_lens(x, y)
    after = pool(page)
    assert all(e["answered"] > n for e, n in zip(after, before)), after
    assert all(e["in_flight"] == 0 and e["failed_over"] == 0 for e in after), after


def test_a_full_engine_says_so_at_once_and_the_other_answers(page, reference, engines):
    a, b = engines
    want = reference.lens(LensRequest(prompts=LENS.prompts[:1], lens="both", k=5))
    held = hold(a.port, MAX_BATCH)
    try:
        deadline = time.time() + 30
        while post(a.url, fail_if_busy=True) != 429:       # the door has counted both
            assert time.time() < deadline, "the engine never said it was full"
            time.sleep(0.2)
        assert post(b.url, fail_if_busy=True) == 200         # not full: let in
        before = pool(page)
        t = time.perf_counter()
        got = page.lens(LensRequest(prompts=LENS.prompts[:1], lens="both", k=5))
        took = time.perf_counter() - t
        after = pool(page)
    finally:
        for s in held:
            s.close()
    assert_same_lens(got[0], want[0])
    assert after[0]["busy"] > before[0]["busy"] and after[0]["answered"] == before[0]["answered"], after
    assert after[1]["answered"] > before[1]["answered"] and took < 20, (took, after)
    deadline = time.time() + 30
    while post(a.url, fail_if_busy=True) != 200:            # the held traces gone, it has room again
        assert time.time() < deadline, "the engine stayed full after its traces left"
        time.sleep(0.2)


def test_an_engine_killed_under_load_loses_nothing_and_serves_again_once_back(page, reference, engines):
    a = engines[0]
    want_lens, want_long = reference.lens(LENS), reference.generate(LONG)
    before = pool(page)

    def ask(i):
        return page.generate(LONG) if i % 2 else page.lens(LENS)

    with ThreadPoolExecutor(8) as threads:
        answers = [threads.submit(ask, i) for i in range(8)]
        deadline = time.time() + 60
        while pool(page)[0]["in_flight"] == 0:             # kill it with work on it
            assert time.time() < deadline and not all(f.done() for f in answers), pool(page)
            time.sleep(0.05)
        os.killpg(a.proc.pid, signal.SIGKILL)
        t = time.perf_counter()
        results = [f.result(timeout=300) for f in answers]   # every one answered: none raises
        waited = time.perf_counter() - t
    a.proc.wait(timeout=30)
    for i, got in enumerate(results):
        if i % 2:
            assert got.token_ids == want_long.token_ids and got.text == want_long.text
        else:
            for x, y in zip(got, want_lens):
                assert_same_lens(x, y)
    h = page.health()
    assert h["state"] == "ready" and h["restarts"] == 0 and h["calls"]["restarted"] == 0, h
    dead = h["engines"][0]
    assert not dead["up"] and dead["failed_over"] > before[0]["failed_over"] and dead["reason"], dead
    print(f"an engine killed under 8 requests: all answered, the last {waited:.1f} s after the kill")

    a.proc = start_engine(a.port, a.log)        # started again on its port, without a lens: the page gives it its own
    until_ready(a.proc, a.log, starts=2)
    deadline = time.time() + 60
    while not pool(page)[0]["up"]:
        assert time.time() < deadline, pool(page)
        time.sleep(0.5)
    served = pool(page)[0]["answered"]
    for x, y in zip(page.lens(LENS), want_lens):             # alone: to the first of the least loaded, it
        assert set(y.lenses) == {"logit", "jacobian"}
        assert_same_lens(x, y)
    assert pool(page)[0]["answered"] > served, pool(page)

"""Generations and chats streamed through an engine service (`lensapp engine`'s stream route:
engine/run/served_stream.py, stream_route.py): each step reaches the page as the service's worker writes it, the
streamed whole is the one-shot whole and the in-process one, and a stream the page closes is aborted on the engine,
which serves the next request.

The engine service, its relay and the page on it are test_engine_service.py's fixtures (one service for this
module); the in-process reference is the session's `vllm_service`, given the same lens."""

import time
import urllib.error
import urllib.request

import pytest
import test_engine_service as service_tests
import torch
from test_stream import freed, same_readout, spec_of

from lensapp.engine.run.protocol import Sampling
from lensapp.engine.run.step_stream import Step
from lensapp.service import planning

pytestmark = pytest.mark.engine

KEY, LENS_LAYERS = service_tests.KEY, service_tests.LENS_LAYERS
# the engine service's fixtures (module-scoped: one service for this module)
engine, relay, page = service_tests.engine, service_tests.relay, service_tests.page
lens_file, reference = service_tests.lens_file, service_tests.reference

STORY = "Write a long story about a dragon who"


def timed(stream) -> tuple[list[float], list[Step], object]:
    """(each step's arrival in seconds from the start, the steps, the output)."""
    t, arrivals, steps, out = time.perf_counter(), [], [], None
    for item in stream:
        if isinstance(item, Step):
            arrivals.append(time.perf_counter() - t)
            steps.append(item)
        else:
            out = item
    return arrivals, steps, out


def close_to(a: dict, b: dict) -> None:
    for lens in b:
        for field in b[lens]:
            torch.testing.assert_close(a[lens][field], b[lens][field])


def test_a_generation_and_a_chat_stream_each_step_as_in_process(page, reference):
    """Each step leaves the service as the worker writes it (the arrivals spread over the decoding; handed out at the
    end they would come within milliseconds of each other), equals the request's own saved step bitwise, and the
    whole equals the one-shot whole through the service and the in-process one (greedy, seeded, and a chat)."""
    spec, here = (spec_of(s, prompt=STORY, layers=LENS_LAYERS) for s in (page, reference))
    for sampling in (Sampling(16), Sampling(16, temperature=0.8, seed=11)):
        one_shot = page.engine.generate(spec, sampling)
        arrivals, steps, out = timed(page.engine.generate_steps(spec, sampling))
        in_process = reference.engine.generate(here, sampling)
        assert [s.token_id for s in steps] == out.token_ids == one_shot.token_ids == in_process.token_ids
        assert [s.index for s in steps] == list(range(len(steps)))
        for step, saved, want, local in zip(steps, out.steps, one_shot.steps, in_process.steps):
            same_readout(step.readout, saved)
            close_to(saved, want)
            close_to(saved, local)
        # Timed against this stream's own length (a machine shared with other work times each request differently).
        assert len(steps) >= 4, [s.token_id for s in steps]
        decoding = arrivals[-1] * (len(steps) - 1) / (len(steps) + 4)    # a prefill of this prompt: ~5 steps' time
        assert arrivals[-1] - arrivals[0] > 0.3 * decoding > 0.01, arrivals
        assert sum(a < arrivals[-1] - 0.1 * decoding for a in arrivals) >= len(steps) // 2, arrivals

    # A chat's reply ends with its end of text, before its max_tokens: the block's last statement never runs (where
    # the one-shot route reads the tokens), and the stream's answer carries vLLM's own output.
    chat, chat_here = (chat_spec(s) for s in (page, reference))
    one_shot = page.engine.chat(chat, Sampling(40))
    arrivals, steps, out = timed(page.engine.chat_steps(chat, Sampling(40)))
    in_process = reference.engine.chat(chat_here, Sampling(40))
    assert [s.token_id for s in steps] == out.token_ids == one_shot.token_ids == in_process.token_ids
    assert 4 <= len(steps) < 40 and steps[-1].token_id in page.prompts.stop_ids, [s.token_id for s in steps]
    assert [s.readout for s in steps] == list(zip(one_shot.top_ids, one_shot.top_probs))
    assert out.top_ids == in_process.top_ids
    torch.testing.assert_close(torch.tensor(out.top_probs), torch.tensor(in_process.top_probs))
    assert arrivals[-1] - arrivals[0] > 0.05, arrivals


def chat_spec(service):
    """A question in the model's chat template, read through the Jacobian lens at one layer (a chat's readout)."""
    ids = service.prompts.ids("What is the capital of France?", chat=True)
    return planning.lens_spec(ids, [LENS_LAYERS[1]], 5, ("jacobian",), service.info.n_layers, service.jlens_layers)


def until_idle(wire, within: float, window: float = 0.5, busy: float = 0.1) -> float:
    """Seconds until the service's vLLM processes spend less than `busy` of a core over `window` (inf: not within)."""
    t = time.perf_counter()
    last = wire.progress()
    while time.perf_counter() - t < within:
        time.sleep(window)
        now = wire.progress()
        if now - last < busy * window:
            return time.perf_counter() - t
        last = now
    return float("inf")


def test_a_stream_the_page_closes_is_aborted_on_the_engine(page, engine, reference):
    """A long generation closed after its third step: the page frees its slot, the service sees the page leave and
    aborts the request (its log says so, and its vLLM processes go idle long before the rest would have been
    written), and it serves the next request, the in-process answer."""
    spec = spec_of(page, prompt=STORY, lenses=("logit",))
    before = page.engine.health()["calls"]
    stream = page.engine.generate_steps(spec, Sampling(240))
    t = time.perf_counter()
    next(stream)
    first = time.perf_counter()
    next(stream), next(stream)
    per_step = (time.perf_counter() - first) / 2
    stream.close()
    closed = time.perf_counter()
    health = freed(page.engine, 10)
    assert health["in_flight"] == 0 and health["admitted"] == 0
    assert health["calls"]["cancelled"] == before["cancelled"] + 1 and health["calls"]["served"] == before["served"]
    from lensapp.engine.run.served import Wire

    idle = until_idle(Wire(engine.url, KEY), within=20)
    left = 237 * per_step                                 # what the rest of the generation would have taken
    assert idle < min(10.0, 0.5 * left), (idle, per_step, first - t)
    deadline = time.time() + 10
    while "a page left its stream" not in engine.log.read_text():
        assert time.time() < deadline, engine.log.read_text()[-2000:]
        time.sleep(0.2)
    print(f"\nstream closed after 3 steps ({per_step * 1000:.0f} ms a step): the engine idle "
          f"{time.perf_counter() - closed:.2f} s after the close (the rest: ~{left:.0f} s)")
    after = page.engine.generate(spec, Sampling(6))
    assert after.token_ids == reference.engine.generate(spec_of(reference, prompt=STORY, lenses=("logit",)),
                                                        Sampling(6)).token_ids


def stream_post(url: str, key: str | None, stream_key: str | None = "ab12", body: bytes = b"not a trace"):
    headers = {name: value for name, value in (("ndif-api-key", key), ("lensapp-stream-key", stream_key)) if value}
    request = urllib.request.Request(url + "/lensapp/stream", data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, r.headers.get("content-type"), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("content-type"), e.read()


def test_the_stream_route_is_behind_the_key_and_answers_bad_input_in_one_frame(engine, relay):
    import asyncio

    from lensapp.engine.run.served import Wire

    assert stream_post(engine.url, None)[0] == 401 and stream_post(engine.url, "wrong")[0] == 401
    status, _, body = stream_post(engine.url, KEY, stream_key="not hex!")
    assert status == 400 and b"lensapp-stream-key" in body
    assert "refused POST '/lensapp/stream' from 127.0.0.1: no key" in engine.log.read_text()

    async def frames(wire):
        async with wire.async_client() as client:
            return [f async for f in wire.astream(client, b"not a trace", "ab12")]
    got = asyncio.run(frames(Wire(engine.url, KEY)))          # a bad trace: its own error, as the one-shot route's
    assert len(got) == 1 and got[0]["saves"] == {} and got[0]["error"]["type_name"]

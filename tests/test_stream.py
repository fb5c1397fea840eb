"""Generations and chats streamed step by step (engine/run/step_stream.py): the same steps as the one-shot
path, and a reader that leaves frees the engine at once."""

import time

import pytest
import torch

from lensapp.engine.run.edit import Edit
from lensapp.engine.run.protocol import Sampling
from lensapp.engine.run.step_stream import Step
from lensapp.service import planning


def spec_of(service, prompt="The capital of France is", layers=None, edits=(), lenses=("logit", "jacobian")):
    import dataclasses

    n = service.info.n_layers
    ids = service.prompts.ids(prompt)
    spec = planning.lens_spec(ids, list(range(n)) if layers is None else layers, 5, lenses, n, service.jlens_layers)
    return dataclasses.replace(spec, edits=tuple(edits))


def streamed(stream):
    steps, out = [], None
    for item in stream:
        if isinstance(item, Step):
            steps.append(item)
        else:
            out = item
    return steps, out


def same_readout(a, b):
    assert a.keys() == b.keys()
    for lens in a:
        assert a[lens].keys() == b[lens].keys()
        for field in a[lens]:
            torch.testing.assert_close(a[lens][field], b[lens][field], rtol=0, atol=0)


@pytest.mark.parametrize("sampling", [Sampling(8), Sampling(8, temperature=1.0, seed=3)], ids=["greedy", "seeded"])
def test_streamed_steps_are_the_one_shot_generation(tiny_service, sampling):
    spec = spec_of(tiny_service)
    one_shot = tiny_service.engine.generate(spec, sampling)
    steps, out = streamed(tiny_service.engine.generate_steps(spec, sampling))
    assert [s.index for s in steps] == list(range(len(one_shot.token_ids)))
    assert [s.token_id for s in steps] == one_shot.token_ids == out.token_ids
    for step, want in zip(steps, one_shot.steps):
        same_readout(step.readout, want)
    assert steps[0].readout["logit"]["top_ids"].shape[1] == len(spec.input_ids)


def test_a_steered_generation_streams_its_steered_steps(tiny_service):
    d = tiny_service.info.d_model
    steer = Edit(layer=1, kind="add", vector=torch.full((d,), 3.0), generated=True)
    spec = spec_of(tiny_service, edits=[steer])
    one_shot = tiny_service.engine.generate(spec, Sampling(6))
    plain = tiny_service.engine.generate(spec_of(tiny_service), Sampling(6))
    steps, _ = streamed(tiny_service.engine.generate_steps(spec, Sampling(6)))
    assert [s.token_id for s in steps] == one_shot.token_ids
    for step, want in zip(steps, one_shot.steps):
        same_readout(step.readout, want)
    assert not torch.equal(one_shot.steps[1]["logit"]["top_probs"], plain.steps[1]["logit"]["top_probs"])


def test_a_chat_streams_its_per_token_readout(tiny_service):
    spec = spec_of(tiny_service, layers=[2])
    one_shot = tiny_service.engine.chat(spec, Sampling(6))
    steps, out = streamed(tiny_service.engine.chat_steps(spec, Sampling(6)))
    assert [s.token_id for s in steps] == one_shot.token_ids == out.token_ids
    assert [s.readout for s in steps] == list(zip(one_shot.top_ids, one_shot.top_probs))


def freed(engine, within: float) -> dict:
    """The engine's health once it holds nothing (a closed stream's cancel ends on the engine's loop, after the
    close has returned), or as it is after `within` seconds."""
    deadline = time.perf_counter() + within
    while (health := engine.health())["in_flight"] or health["admitted"]:
        if time.perf_counter() > deadline:
            break
        time.sleep(0.005)
    return health


def test_a_reader_that_leaves_frees_the_engine_at_once(tiny_service):
    engine = tiny_service.engine
    before = engine.health()["calls"]
    spec = spec_of(tiny_service)
    t = time.perf_counter()
    whole = engine.generate(spec, Sampling(60))
    full = time.perf_counter() - t
    assert len(whole.token_ids) == 60
    stream = engine.generate_steps(spec, Sampling(60))
    first = next(stream)
    assert isinstance(first, Step) and first.index == 0
    t = time.perf_counter()
    stream.close()
    health = freed(engine, full)
    assert time.perf_counter() - t < full / 2
    assert health["in_flight"] == 0 and health["admitted"] == 0
    assert health["calls"]["cancelled"] == before["cancelled"] + 1
    assert health["calls"]["served"] == before["served"] + 1        # the whole one only


class HeldLoop:
    """A stand-in backend whose chat writes a step every 5 ms and, after its third, holds the engine's loop (a step
    that does not give the loop back: the transformers backend generates on it) until `release` is set."""

    concurrent = True

    def __init__(self):
        import threading

        self.holding, self.release, self.written = threading.Event(), threading.Event(), 0

    async def run_chat(self, spec, sampling, sink):
        import asyncio

        from lensapp.engine.run.protocol import ChatOutput

        tokens = []
        for i in range(sampling.max_tokens):
            tokens.append(i)
            sink.tokens(tokens)
            sink.readout(i, ([i], [1.0]))
            self.written += 1
            if i == 2:
                self.holding.set()
                self.release.wait(10)               # the loop held, not awaited
            await asyncio.sleep(0.005)
        return ChatOutput(tokens, [[t] for t in tokens], [[1.0] for _ in tokens])

    def failure(self):
        return None

    def progress(self):
        from lensapp.engine.run.protocol import Progress

        return Progress(self.written, 0.0)

    def is_dead(self, error):
        return None

    def close(self):
        self.release.set()


def test_a_closed_stream_returns_at_once_while_the_engines_loop_is_held_and_the_engine_then_lets_go():
    """Gradio closes a generator handler on its own event loop (gradio 6.31: `SyncToAsyncIterator.aclose`): the close
    must not wait for the engine's loop. It returns at once while that loop is held; the engine still counts the
    request until its loop turns again, then cancels it there and lets go of it."""
    import threading

    from lensapp.engine.run.core import Engine
    from lensapp.engine.run.protocol import ModelInfo

    backend = HeldLoop()
    info = ModelInfo(name="stand-in", n_layers=2, d_model=4, vocab_size=8, backend="vllm-cpu", device="cpu",
                     dtype="float32")
    engine = Engine(lambda: backend, info, request_timeout=60, watchdog_seconds=60)
    try:
        engine.wait_ready(10)
        stream = engine.chat_steps(None, Sampling(200), client="visitor")
        assert [next(stream).index for _ in range(3)] == [0, 1, 2]
        assert backend.holding.wait(10)
        letgo = threading.Timer(1.0, backend.release.set)      # the loop turns again 1 s from now
        letgo.start()
        t = time.perf_counter()
        stream.close()
        closed = time.perf_counter() - t
        held = engine.health()
        assert closed < 0.1, closed
        assert held["admitted"] == 1 and not backend.release.is_set()   # still the engine's: its loop is held
        health = freed(engine, 10)
        assert backend.release.is_set() and health["in_flight"] == 0 and health["admitted"] == 0, health
        assert health["calls"]["cancelled"] == 1 and health["calls"]["served"] == 0
        assert backend.written < 10                            # stopped where it was, not run to its end
        assert [s.index for s in streamed(engine.chat_steps(None, Sampling(3), client="visitor"))[0]] == [0, 1, 2]
        letgo.cancel()
    finally:
        backend.release.set()
        engine.close()


def test_the_outbox_hands_each_step_over_once_and_forgets_ended_streams():
    import pickle

    from lensapp.engine.run.outbox import Outbox, take_published

    class Module:
        pass

    module = Module()
    rows = torch.arange(12.0).reshape(3, 4)
    box = Outbox()
    box.put("a", 0, {"top_ids": rows[1:2]})
    box.put("a", 1, (rows[2], rows[0]))
    box.put("b", 0, {"x": rows})
    taken = box.take()
    assert [step for step, _ in taken["a"]] == [0, 1] and list(taken["b"][0][1]) == ["x"]
    assert taken["a"][0][1]["top_ids"].untyped_storage().nbytes() == 4 * 4      # the row, not the buffer
    assert box.take() == {}
    box.put("a", 2, {})
    box.put("b", 1, {})
    assert list(box.take(forget=("a",))) == ["b"]
    assert pickle.loads(take_published(module)) == {}         # a module's outbox is made on first use


def test_the_courier_takes_once_per_step_for_every_stream_and_survives_a_worker_without_the_method():
    import asyncio
    import queue

    from lensapp.engine.run.courier import Courier
    from lensapp.engine.run.outbox import TAKE, take_published
    from lensapp.engine.run.step_stream import StepSink

    class Module:
        pass

    module, calls = Module(), []

    async def rpc(method, args=()):
        calls.append((method, args))
        return [take_published(module, *args)]

    async def run():
        from lensapp.engine.run.outbox import outbox_of

        courier = Courier(rpc)
        events = [queue.SimpleQueue(), queue.SimpleQueue()]
        sinks = [StepSink(q.put) for q in events]
        keys = [courier.open(sink) for sink in sinks]
        for key in keys:
            outbox_of(module).put(key, 0, {"step": torch.tensor([0])})
        for sink in sinks:
            sink.tokens([7])
        courier.kick()
        courier.kick()                        # a take on its way: one more after it, not two at once
        await courier._task
        assert [q.get_nowait().token_id for q in events] == [7, 7]
        outbox_of(module).put(keys[0], 1, {})
        courier.close(keys[0])
        courier.close(keys[1])                # the last stream ended: one take forgets both
        await courier._task
        assert calls[-1][0] == TAKE and set(calls[-1][1][0]) == set(keys)
        assert outbox_of(module).take() == {}

        async def missing(method, args=()):
            raise NotImplementedError(f"no {method}")

        broken = Courier(missing)
        assert broken.open(sinks[0])
        broken.kick()
        await broken._task
        assert not broken.working and broken.open(sinks[0]) == ""

    asyncio.run(run())


def service_streamed(items):
    from lensapp.service.generating import Partial

    partials = [item for item in items if isinstance(item, Partial)]
    assert not isinstance(items[-1], Partial)
    return partials, items[-1]


@pytest.mark.parametrize("settings", [{}, {"temperature": 0.9, "seed": 5}, {"force": "3=Paris"},
                                      {"force": "1=#7, 4=the", "temperature": 0.9, "seed": 5}],
                         ids=["greedy", "seeded", "forced", "forced-twice-seeded"])
def test_a_streamed_generation_is_the_one_shot_result_step_for_step(tiny_service, settings):
    from lensapp.service.requests import GenerateRequest

    req = GenerateRequest.parse(prompt="The capital of France is", max_tokens=8, lens="both", layers="all", k=3,
                                **settings)
    whole = tiny_service.generate(req)
    partials, final = service_streamed(list(tiny_service.generate_stream(req)))
    assert final.to_json() == whole.to_json()
    assert [p.index for p in partials] == list(range(len(whole.steps)))
    for p, step in zip(partials, whole.steps):
        assert p.step.token_id == step.token_id
        assert p.step.readout.to_json()["lenses"] == step.readout.to_json()["lenses"]
    assert partials[-1].text == whole.text
    assert partials[-1].so_far().to_json() == whole.to_json()
    assert len(partials[2].so_far().steps) == 3 <= len(whole.steps)


def test_a_streamed_chat_is_the_one_shot_reply_token_for_token(tiny_service):
    from lensapp.service.requests import ChatRequest

    req = ChatRequest.parse(messages=[{"role": "user", "content": "Hi there"}], lens="logit", max_tokens=6, k=3)
    whole = tiny_service.chat(req)
    partials, final = service_streamed(list(tiny_service.chat_stream(req)))
    assert final.to_json() == whole.to_json()
    frames = [p.to_json() for p in partials]
    assert [f["token_id"] for f in frames] == whole.token_ids
    assert [f["readout"] for f in frames] == whole.to_json()["readout"]
    assert frames[-1]["text"] == whole.text and frames[0]["frame"] == "step"
    assert partials[-1].so_far().to_json() == whole.to_json()


def test_a_stream_closed_early_keeps_nothing_and_its_waiter_computes_its_own():
    import threading

    from lensapp.service.cache import ResultCache

    cache = ResultCache(8, 1 << 20)
    computed = []

    def stream():
        yield "partial"
        yield "partial"
        computed.append(1)
        yield "whole"

    first = cache.streamed("k", stream)
    assert next(first) == "partial"
    answers = []
    waiter = threading.Thread(target=lambda: answers.append(cache.get_or_compute("k", lambda: "computed")))
    waiter.start()
    while cache.stats()["shared_in_flight"] == 0:
        pass
    first.close()                                   # the reader left
    waiter.join(10)
    assert answers == ["computed"] and not computed
    assert list(cache.streamed("k", stream)) == ["computed"]      # the waiter's answer was kept
    assert list(cache.streamed("j", stream)) == ["partial", "partial", "whole"]
    assert list(cache.streamed("j", stream)) == ["whole"]


@pytest.mark.engine
def test_on_vllm_each_step_leaves_the_worker_as_it_is_done_and_a_reader_that_leaves_frees_the_engine(vllm_service):
    """On vLLM the steps come from the worker's outbox while the request runs (not from its saves at the end): the
    first arrives long before the last, each equals the request's own saved step bitwise and the one-shot path's
    (greedy and seeded); a stream closed after two steps is cancelled at once."""
    engine = vllm_service.engine
    spec = spec_of(vllm_service, prompt="Write a long story about a dragon who", lenses=("logit",))
    for sampling in (Sampling(24), Sampling(24, temperature=0.8, seed=11)):
        t = time.perf_counter()
        one_shot = engine.generate(spec, sampling)
        whole = time.perf_counter() - t                          # the request, handed out at its end
        t, arrivals, steps, out = time.perf_counter(), [], [], None
        for item in engine.generate_steps(spec, sampling):
            if isinstance(item, Step):
                arrivals.append(time.perf_counter() - t)
                steps.append(item)
            else:
                out = item
        assert [s.token_id for s in steps] == out.token_ids == one_shot.token_ids
        for step, saved, want in zip(steps, out.steps, one_shot.steps):
            same_readout(step.readout, saved)
            for field in want["logit"]:
                torch.testing.assert_close(step.readout["logit"][field], want["logit"][field])
        # Streamed, not handed out at the end: the steps arrive spread over the decoding (handed out at the end they
        # would come within milliseconds of each other). A sampled story may end early (6 tokens, its prefill half
        # of the time), so the spread is compared with the decoding's share of the one-shot request, not the total.
        assert len(steps) >= 4, [s.token_id for s in steps]
        decoding = whole * (len(steps) - 1) / (len(steps) + 4)       # a prefill of this prompt: ~5 steps' time
        assert arrivals[-1] - arrivals[0] > 0.3 * decoding, (arrivals, whole)
    before = engine.health()["calls"]
    stream = engine.generate_steps(spec, Sampling(64))
    next(stream), next(stream)
    stream.close()
    health = freed(engine, 10)
    assert health["in_flight"] == 0 and health["admitted"] == 0
    assert health["calls"]["cancelled"] == before["cancelled"] + 1 and health["calls"]["served"] == before["served"]

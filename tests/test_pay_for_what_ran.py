"""A visitor pays for what ran (service/limits.py, asks.Ask.paying): work the engine refuses is given back to the
buckets it was taken from, a stopped generation pays for the steps it made, and an identical request joined in
flight is asked again as the waiter's own when the first asker was refused for its own reasons. The real
RateLimiter, Guard and engine on the tiny model; the clock stopped, so nothing refills behind the test's back."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from types import SimpleNamespace

import gradio as gr
import pytest

from lensapp.engine.run.parts import Part
from lensapp.service import GenerateRequest, LensRequest
from lensapp.service import cost as costs
from lensapp.service.asks import Ask
from lensapp.service.limits import RateLimited, RateLimiter
from lensapp.ui.guard import Guard

ADDRESS = "203.0.113.7"
VISITOR = SimpleNamespace(client=SimpleNamespace(host=ADDRESS), headers={})


def limited(units: float) -> tuple[RateLimiter, Guard]:
    """A guard whose visitors' work bucket holds `units` and, the clock stopped, never refills."""
    limiter = RateLimiter(per_minute=600, clock=lambda: 0.0, work_per_minute=60, work_burst=int(units))
    return limiter, Guard(limiter)


def budget(limiter: RateLimiter) -> float:
    return limiter._buckets[ADDRESS].work.tokens


@contextlib.contextmanager
def share_taken(engine, client: str, n: int):
    """`client` already has `n` requests admitted at the engine (held until the block ends): one more is over its
    share (turns.OverShare, told as EngineBusy)."""
    gate = threading.Event()

    async def held(backend):
        while not gate.is_set():
            await asyncio.sleep(0.005)

    calls = [engine.submit("held", [Part(held)], 30, client) for _ in range(n)]
    try:
        yield
    finally:
        gate.set()
        for call in calls:
            call.future.result(30)
            engine.leave(call)


def test_work_the_engine_refuses_is_given_back_and_pressing_again_after_busy_is_answered(tiny_service):
    """Over its share at the engine, the visitor's request is refused "busy" and its budget is as before; pressed
    again (and again) it is refused busy again, never "too much work from your address"; once a request of theirs
    finishes, the next press is answered and paid for once. Before, each busy press kept its planned cost: the second
    press was refused for the budget."""
    req = LensRequest(prompts=("The capital of France is",), layers="all", k=5, lens="logit")
    units = tiny_service.check(req).units(tiny_service.token_weight)
    limiter, guard = limited(1.5 * units)            # one request's work fits, two do not
    guard.limiter.check(ADDRESS)                      # the address's buckets exist: a full one to compare with
    full = budget(limiter)
    with share_taken(tiny_service.engine, ADDRESS, tiny_service.cfg.limits.client_requests):
        for _ in range(3):                            # the second was "too much work from your address"
            with pytest.raises(gr.Error, match="requests running or waiting here") as refused:
                guard.api(VISITOR, tiny_service.lens, req)
            assert refused.value.title == "Busy"
        assert budget(limiter) == full                    # nothing of it ran: all given back
    (result,) = guard.api(VISITOR, tiny_service.lens, req)
    assert result.layers == list(range(tiny_service.info.n_layers))
    assert budget(limiter) == pytest.approx(full - units)       # what ran is paid for, once


def test_a_stopped_generation_pays_for_the_steps_it_made(tiny_service):
    """A 24-token generation stopped after its first step pays for its prompt and one step (cost.generation of one
    token), and gives back the other 23's; one that runs to its end pays for every token it wrote."""
    req = GenerateRequest(prompt="The capital of France is", max_tokens=24, layers="all", k=5, lens="logit")
    plan = tiny_service.generator.plan(req)
    weight, cells = tiny_service.token_weight, tiny_service.cfg.limits.part_cells
    planned = plan.cost.units(weight)
    one_step = costs.generation(plan.specs[0], 1, cells).units(weight)
    assert one_step < planned / 4
    limiter, guard = limited(10 * planned)
    guard.limiter.check(ADDRESS)
    full = budget(limiter)

    stream = guard.api_stream(VISITOR, tiny_service.generate_stream, req)
    first = next(stream)
    assert first.index == 0
    stream.close()                                                   # Stop
    assert budget(limiter) == pytest.approx(full - one_step)         # was full - planned

    whole = list(guard.api_stream(VISITOR, tiny_service.generate_stream, req))[-1]
    wrote = costs.generation(plan.specs[0], len(whole.token_ids), cells).units(weight)
    assert budget(limiter) == pytest.approx(full - one_step - wrote)


def test_a_stopped_chat_pays_for_the_tokens_it_wrote(tiny_service):
    from lensapp.service.requests import ChatRequest

    req = ChatRequest(messages=({"role": "user", "content": "Name a city."},), max_tokens=24)
    work = tiny_service.generator._chat_work(req)
    weight = tiny_service.token_weight
    limiter, guard = limited(10 * work.cost.units(weight))
    guard.limiter.check(ADDRESS)
    full = budget(limiter)
    stream = guard.api_stream(VISITOR, tiny_service.chat_stream, req)
    next(stream), next(stream)
    stream.close()
    n_prompt = len(work.spec.input_ids)
    assert costs.chat(n_prompt, 24) == work.cost
    assert budget(limiter) == pytest.approx(full - costs.chat(n_prompt, 2).units(weight))      # was full - planned


def test_a_waiter_is_asked_again_as_itself_when_the_first_asker_was_refused_its_own_budget(tiny_service):
    """Two identical requests in flight together: the first asker's budget refuses it (its own RateLimited); the
    second, joined to it, is not handed that refusal: it computes its own answer, on its own turn, and pays for it.
    Before, it got "too much work from your address", the first asker's words."""
    req = LensRequest(prompts=("Two identical requests at once",), layers="all", k=5, lens="logit")
    units = tiny_service.check(req).units(tiny_service.token_weight)
    gate, paid, out = threading.Event(), [], {}

    def broke(n):
        gate.wait(10)
        raise RateLimited("too much work from your address for now; try again in 9 s")

    def ask(name, who):
        try:
            out[name] = tiny_service.lens(req, ask=who)
        except Exception as e:  # noqa: BLE001 - what each asker was answered
            out[name] = e

    first = threading.Thread(target=ask, args=("first", Ask("198.51.100.1", payer=broke)))
    first.start()
    shared = tiny_service.cache.stats()["shared_in_flight"]
    second = threading.Thread(target=ask, args=("second", Ask("198.51.100.2", payer=paid.append)))
    deadline = time.monotonic() + 10
    while tiny_service.cache.stats()["in_flight"] < 1 and time.monotonic() < deadline:
        time.sleep(0.005)
    second.start()
    while tiny_service.cache.stats()["shared_in_flight"] == shared and time.monotonic() < deadline:
        time.sleep(0.005)
    gate.set()
    first.join(30)
    second.join(30)
    assert isinstance(out["first"], RateLimited)
    assert isinstance(out["second"], list) and out["second"][0].prompt == req.prompts[0], out["second"]
    assert paid == [units]

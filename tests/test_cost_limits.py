"""Charged by cost: a request spends what the engine really does for it, and cosmetic variants of one request are
one request (their cache key is the request resolved), on the tiny random Llama's transformers backend.

What is counted is the engine's work: its one door (`Engine.run`, by request kind) is wrapped in a counter that
calls the real method, and the guard's rate limiter is the real one, its clock stopped.
"""

from __future__ import annotations

import dataclasses
import threading

import gradio as gr
import pytest

from lensapp import config
from lensapp.service import ComponentsRequest, GenerateRequest, InterveneRequest, LensRequest, LensService
from lensapp.service.limits import RateLimiter
from lensapp.ui.guard import Guard

FRANCE = "The capital of France is"
VISITOR = "203.0.113.7"


@pytest.fixture(scope="module")
def cached_service(tiny_model_dir):
    """The tiny model with a result cache (the shared tiny service has none) and a small work budget."""
    service = LensService.start(config.Config.of(model=str(tiny_model_dir), backend="transformers", jlens="none",
                                              max_work=4000, request_timeout=60))
    service.wait_ready(300)
    yield service
    service.close()


@pytest.fixture
def engine_calls(cached_service, monkeypatch):
    """How many engine requests of each kind ran (the real engine runs them)."""
    calls, real = {}, cached_service.engine.run

    def counted(kind, *args, **kwargs):
        calls[kind] = calls.get(kind, 0) + 1
        return real(kind, *args, **kwargs)
    monkeypatch.setattr(cached_service.engine, "run", counted)
    return calls


def visitor():
    from types import SimpleNamespace

    return SimpleNamespace(client=SimpleNamespace(host=VISITOR), headers={})


def spent(limiter: RateLimiter) -> float:
    """The work the visitor has spent (its bucket's capacity less what is left; the clock is stopped)."""
    return limiter.work.capacity - limiter._buckets[VISITOR].work.tokens


def test_twenty_cosmetic_variants_of_a_greedy_generation_cost_one(cached_service, engine_calls):
    limiter = RateLimiter(per_minute=6000, clock=lambda: 0.0, work_per_minute=10**6, work_burst=10**6)
    guard = Guard(limiter)
    spellings = ["all", "0-3", "0,1,2,3", "0-1,2-3", "-4--1"]
    variants = [GenerateRequest.parse(prompt=FRANCE, max_tokens="3", layers=spellings[i % 5], seed=str(i),
                                      temperature=["0", "0.0", "0.000001"][i % 3]) for i in range(20)]
    results = [guard.api(visitor(), cached_service.generate, req) for req in variants]
    assert engine_calls == {"generate": 1}
    assert all(r.token_ids == results[0].token_ids for r in results)
    assert spent(limiter) == cached_service.check(variants[0]).units(cached_service.token_weight)
    sampled = GenerateRequest.parse(prompt=FRANCE, max_tokens="3", temperature="0.8", seed="1")
    guard.api(visitor(), cached_service.generate, sampled)
    guard.api(visitor(), cached_service.generate, dataclasses.replace(sampled, seed=2))   # a sample: seeds differ
    assert engine_calls == {"generate": 3}


def test_cosmetic_variants_of_an_intervention_and_a_components_readout_run_once(cached_service, engine_calls):
    n = len(cached_service.prompts.ids(FRANCE))
    for layer, positions in (("1", "0-2"), ("-3", "2,1,0"), ("1-1", f"{-n}-{2 - n}")):
        cached_service.intervene(InterveneRequest.parse(prompt=FRANCE, intervention="steer", word="Rome",
                                                        layer=layer, positions=positions, seed="7"))
    assert engine_calls["lens"] == 2                  # the typical norms' reference once, then the readouts once
    for position in ("-1", str(n - 1)):
        for patterns in ("-1", "3"):
            cached_service.components(ComponentsRequest.parse(prompt=FRANCE, target="Paris", position=position,
                                                              patterns=patterns))
    assert engine_calls["components"] == 1


def test_distinct_heavy_requests_are_limited_by_cost_before_count(cached_service):
    """Twenty distinct lenses of ~900 units each against a work budget of 2,000 a minute in bursts of 2,000 (twice
    a max_work of 1,000): the third or so is refused for its work, while the count (a burst of 12) would have
    taken twelve."""
    limiter = RateLimiter.of(dataclasses.replace(cached_service.cfg.limits, rate_limit=60, work_per_minute=2000,
                                                 max_work=1000))
    limiter.clock = lambda: 0.0
    guard = Guard(limiter)
    long = " ".join(["word"] * 180)
    answered, refused = 0, ""
    for i in range(20):
        req = LensRequest.parse(prompts=[f"{i} {long}"], lens="logit")
        assert cached_service.check(req).units(cached_service.token_weight) > 700
        try:
            guard.api(visitor(), cached_service.lens, req)
            answered += 1
        except gr.Error as e:
            refused = e.message
            break
    assert 2 <= answered < limiter.requests.capacity and refused.startswith("too much work from your address")


def test_four_distinct_requests_at_once_run_only_as_many_as_the_budget_holds(cached_service, engine_calls):
    """Four distinct lenses from one address let in together (each waits for the others inside the guard before it
    reads): with a burst of two and a half lenses' work, two run and two are refused as their work would start;
    while work was spent after the fact, from any bucket at or above zero, all four ran."""
    reqs = [LensRequest.parse(prompts=[f"{i} " + " ".join(["word"] * 60)], lens="logit") for i in range(4)]
    units = {cached_service.check(r).units(cached_service.token_weight) for r in reqs}
    assert len(units) == 1
    (one,) = units
    limiter = RateLimiter(per_minute=600, clock=lambda: 0.0, work_per_minute=6000, work_burst=2 * one + one // 2)
    guard, together = Guard(limiter), threading.Barrier(4)
    answered, refused = [], []

    def read(req):
        together.wait(30)                     # all four let in before any starts its work
        return cached_service.lens(req)

    def ask(req) -> None:
        try:
            answered.append(guard.api(visitor(), read, req))
        except gr.Error as e:
            refused.append(e.message)

    threads = [threading.Thread(target=ask, args=(r,)) for r in reqs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(answered) == 2 and engine_calls == {"lens": 2}
    assert len(refused) == 2 and all(m.startswith("too much work from your address") for m in refused)
    assert spent(limiter) == 2 * one

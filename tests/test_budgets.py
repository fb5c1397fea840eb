"""Budgets hold under concurrency: work in flight is taken before more is let in, so requests running at once from
one address share its budget (`service/limits.py`). The real RateLimiter and Guard, the clock stopped and moved by
hand, requests in threads."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import gradio as gr
import pytest

from lensapp import config
from lensapp.service.asks import asked
from lensapp.service.limits import SITE_SHARE, Bucket, Rate, RateLimiter
from lensapp.ui.guard import Guard

VISITOR = SimpleNamespace(client=SimpleNamespace(host="203.0.113.7"), headers={})


def spend(units: int) -> None:
    """What the service does where engine work starts, in an entry given no ask: the handler's ask pays."""
    asked().pay(units)


def test_a_bucket_refills_waits_and_owes_at_most_a_burst():
    bucket = Bucket(Rate(per_second=10.0, capacity=100.0), share=1, now=0.0)
    bucket.take(70)
    assert bucket.wait(50) == pytest.approx(2.0) and bucket.wait(30) == 0.0
    bucket.refill(1.0)
    assert bucket.tokens == 40 and not bucket.full(6.0) and bucket.full(7.0)
    bucket.take(10**6)                                   # an answer counted after the fact: a burst below zero
    assert bucket.tokens == -100 and bucket.wait(0) == pytest.approx(10.0)
    bucket.refill(100.0)
    assert bucket.tokens == 100                           # never more than its capacity
    site = Bucket(Rate(per_second=10.0, capacity=100.0), share=SITE_SHARE, now=0.0)
    assert (site.capacity, site.per_second) == (100.0 * SITE_SHARE, 10.0 * SITE_SHARE)


def four_at_once(guard: Guard, units: int) -> int:
    """Four requests from one address let in together, each then starting `units` of work (as the service does
    where engine work starts): the units taken. Every request is admitted (or refused) before any work starts,
    the order that let four in flight spend twice the budget."""
    gate, settled, spent = threading.Event(), threading.Semaphore(0), []

    def ask() -> None:
        admitted = False

        def work() -> None:
            nonlocal admitted
            admitted = True
            settled.release()
            gate.wait(10)
            spend(units)
            spent.append(units)
        try:
            guard.api(VISITOR, work)
        except gr.Error:
            if not admitted:
                settled.release()

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for t in threads:
        t.start()
    for _ in threads:
        assert settled.acquire(timeout=10)
    gate.set()
    for t in threads:
        t.join(10)
    return sum(spent)


def test_four_requests_at_once_cannot_spend_more_than_the_budget_a_minute():
    """The default settings (120,000 units a minute, bursts of 48,000), four of the heaviest legal request
    (max_work) at once every six seconds for ten minutes: at most the budget (and one burst), and most of it."""
    cfg = config.Config()
    now = [0.0]
    limiter = RateLimiter.of(cfg.limits)
    limiter.clock = lambda: now[0]
    guard = Guard(limiter)
    minutes, spent = 10, 0
    while now[0] < 60 * minutes:
        spent += four_at_once(guard, cfg.limits.max_work)
        now[0] += 6.0
    budget = cfg.limits.work_per_minute * minutes
    assert 0.9 * budget <= spent <= budget + limiter.work.capacity, spent / minutes     # was 240,000 a minute
    assert limiter.refused > 0


def test_work_refused_for_the_budget_takes_nothing():
    """A request refused as its work starts leaves the budget as it was: the next that fits goes ahead."""
    now = [0.0]
    limiter = RateLimiter(per_minute=600, clock=lambda: now[0], work_per_minute=600, work_burst=100)
    guard = Guard(limiter)
    guard.api(VISITOR, spend, 60)
    with pytest.raises(gr.Error, match="too much work from your address for now; try again in 2 s"):
        guard.api(VISITOR, spend, 60)                  # 40 left
    guard.api(VISITOR, spend, 40)
    assert limiter._buckets[VISITOR.client.host].work.tokens == 0


def test_what_is_given_back_goes_to_the_accounts_it_was_taken_from():
    """`spend` says how to give work back (asks.Receipt keeps what ran): an IPv6 client's /56 and its site's /48
    both get their share back (the very buckets taken from), never more than was taken nor past a bucket's capacity,
    and a receipt gives back at most once what it holds."""
    from lensapp.service.asks import Ask
    from lensapp.service.identity import bucket
    from lensapp.service.identity import site as identity_site

    now = [0.0]
    limiter = RateLimiter(per_minute=600, clock=lambda: now[0], work_per_minute=60, work_burst=100)
    v6 = "2001:db8:1:2::7"
    before = {key: a.work.tokens for key, a in limiter._buckets.items()}
    receipt = Ask(payer=lambda units: limiter.spend(v6, units)).pay(80)
    slash56, site = limiter._buckets[bucket(v6)], limiter._buckets[f"site {identity_site(v6)}"]
    assert (slash56.work.tokens, site.work.tokens) == (20, 400 - 80) and before == {}
    receipt.keep(30)                                    # 30 of the 80 ran: 50 back to each
    assert (slash56.work.tokens, site.work.tokens) == (70, 400 - 30)
    receipt.refund()
    receipt.refund()                                    # what it holds, once
    assert (slash56.work.tokens, site.work.tokens) == (100, 400)

    receipt = Ask(payer=lambda units: limiter.spend("203.0.113.9", units)).pay(250)   # dearer than a burst
    own = limiter._buckets["203.0.113.9"]
    assert own.work.tokens == -100                      # 200 taken: at most a burst below zero
    now[0] = 60.0                                       # refilled by 60 meanwhile
    receipt.refund()
    assert own.work.tokens == 100                       # the 200 given back: never past the capacity

"""`UnembedPool`: one unembedding per decode step for every generation in it, with each request's
logits the same as unembedding its rows alone. The pool's order contract (all submits of a step
before any take) is nnsight's; the real-engine test in `test_engine_vllm.py` checks it holds there."""

import torch

from lensapp.engine.run.unembed_pool import UnembedPool

D, VOCAB = 8, 50


def head():
    torch.manual_seed(0)
    W = torch.randn(VOCAB, D)
    calls = []

    def unembed(x):
        calls.append(x.shape[0])
        return x @ W.T

    return unembed, calls, W


def test_a_step_unembeds_every_request_in_one_matmul_and_each_gets_its_own_rows():
    unembed, calls, W = head()
    pool = UnembedPool()
    rows = [torch.randn(n, D) for n in (3, 1, 5)]
    tickets = [pool.submit(r) for r in rows]
    got = [pool.take(t, unembed) for t in reversed(tickets)][::-1]      # any taker may come first
    assert calls == [9]
    for r, g in zip(rows, got):
        torch.testing.assert_close(g, r @ W.T)
    assert (pool.rounds, pool.requests) == (1, 3)


def test_steps_do_not_mix():
    unembed, calls, W = head()
    pool = UnembedPool()
    for step in range(3):
        rows = [torch.full((2, D), float(step + i)) for i in range(2)]
        tickets = [pool.submit(r) for r in rows]
        for r, t in zip(rows, tickets):
            torch.testing.assert_close(pool.take(t, unembed), r @ W.T)
    assert calls == [4, 4, 4]


def test_rows_over_the_cap_are_unembedded_alone():
    unembed, calls, W = head()
    pool = UnembedPool(max_rows=4)
    a, b, c = torch.randn(3, D), torch.randn(3, D), torch.randn(1, D)
    ta, tb, tc = pool.submit(a), pool.submit(b), pool.submit(c)
    assert (ta.pooled, tb.pooled, tc.pooled) == (True, False, True)
    torch.testing.assert_close(pool.take(tb, unembed), b @ W.T)
    torch.testing.assert_close(pool.take(ta, unembed), a @ W.T)
    torch.testing.assert_close(pool.take(tc, unembed), c @ W.T)
    assert calls == [3, 4]


def test_a_request_that_never_takes_costs_one_extra_round_and_nothing_else():
    unembed, calls, W = head()
    pool = UnembedPool()
    pool.submit(torch.randn(2, D))                      # its trace failed before taking
    x = torch.randn(3, D)
    t = pool.submit(x)
    torch.testing.assert_close(pool.take(t, unembed), x @ W.T)
    y = torch.randn(1, D)
    t = pool.submit(y)
    torch.testing.assert_close(pool.take(t, unembed), y @ W.T)
    assert calls == [5, 1] and pool.requests == 2

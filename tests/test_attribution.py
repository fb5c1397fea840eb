"""Attribution math against direct computations on small hand-built tensors (lensapp/attribution.py)."""

import pytest
import torch

from lensapp import attribution


def _norm(x, g, eps, centred):
    x = x - x.mean(-1, keepdim=True) if centred else x
    return g * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


@pytest.mark.parametrize("centred", [False, True], ids=["rmsnorm", "layernorm"])
def test_the_parts_through_the_frozen_norm_sum_to_the_logit(centred):
    g = torch.Generator().manual_seed(0)
    d, eps = 16, 1e-5
    parts = torch.randn(7, d, generator=g, dtype=torch.float64)           # embed, attn, mlp, ...
    h = parts.sum(0)
    weight, w = torch.rand(d, generator=g, dtype=torch.float64) + 0.5, torch.randn(d, generator=g, dtype=torch.float64)
    u, sigma = attribution.frozen_norm_direction(h, w, weight, eps, centred)
    logit = _norm(h, weight, eps, centred) @ w
    terms = parts.float() @ u
    torch.testing.assert_close(terms.sum().double(), logit, rtol=1e-6, atol=1e-6)
    # each term is the part through the norm frozen at h, the naive way
    for c, term in zip(parts, terms):
        frozen = weight * ((c - c.mean()) if centred else c) / sigma.double()
        torch.testing.assert_close(term.double(), frozen @ w, rtol=1e-5, atol=1e-6)


def test_a_norm_without_a_weight_and_mismatched_shapes():
    h, w = torch.tensor([3.0, 4.0]), torch.tensor([1.0, 0.0])
    u, sigma = attribution.frozen_norm_direction(h, w, None, 0.0, centred=False)
    torch.testing.assert_close(sigma, torch.tensor(12.5).sqrt())
    torch.testing.assert_close(u, w / sigma)
    with pytest.raises(ValueError, match="same"):
        attribution.frozen_norm_direction(h, torch.ones(3), None, 0.0, False)


def test_split_heads_keeps_each_heads_slice_in_its_place():
    z = torch.arange(1.0, 7.0)                                         # 3 heads of 2
    rows = attribution.split_heads(z, 3)
    assert rows.tolist() == [[1, 2, 0, 0, 0, 0], [0, 0, 3, 4, 0, 0], [0, 0, 0, 0, 5, 6]]
    W = torch.randn(5, 6)
    torch.testing.assert_close((rows @ W.T).sum(0), W @ z)              # the heads sum to the projection
    with pytest.raises(ValueError, match="split"):
        attribution.split_heads(z, 4)


def naive_weights(q, k, n_heads, n_kv, scale, softcap=None, window=None):
    """Row by row, head by head, the textbook way."""
    T, d = k.shape[0], q.shape[-1] // n_heads
    Q = q.shape[0]
    out = torch.zeros(n_heads, Q, T)
    for h in range(n_heads):
        kv = h // (n_heads // n_kv)
        for i in range(Q):
            query = T - Q + i
            scores = []
            for j in range(T):
                s = float(q[i, h * d:(h + 1) * d] @ k[j, kv * d:(kv + 1) * d]) * scale
                s = softcap * torch.tanh(torch.tensor(s / softcap)).item() if softcap else s
                visible = j <= query and (window is None or query - j < window)
                scores.append(s if visible else float("-inf"))
            out[h, i] = torch.softmax(torch.tensor(scores), -1)
    return out


@pytest.mark.parametrize("n_heads, n_kv, softcap, window", [(4, 4, None, None), (4, 2, None, None), (4, 1, 2.0, None),
                                                            (2, 1, None, 3), (2, 2, 5.0, 2)])
def test_attention_scores_are_the_textbook_softmax(n_heads, n_kv, softcap, window):
    g = torch.Generator().manual_seed(1)
    T, d = 6, 4
    q, k = torch.randn(T, n_heads * d, generator=g), torch.randn(T, n_kv * d, generator=g)
    got = attribution.attention_scores(q, k, n_heads, n_kv, 0.5, softcap=softcap, window=window)
    torch.testing.assert_close(got, naive_weights(q, k, n_heads, n_kv, 0.5, softcap, window), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.sum(-1), torch.ones(n_heads, T))
    assert (got.triu(1) == 0).all()                                     # no query sees a later key
    last = attribution.attention_scores(q[-2:], k, n_heads, n_kv, 0.5, softcap=softcap, window=window)
    torch.testing.assert_close(last, got[:, -2:])                       # the last queries alone: the same rows


def test_attention_scores_refuse_shapes_that_do_not_fit():
    with pytest.raises(ValueError, match="key heads"):
        attribution.attention_scores(torch.zeros(3, 8), torch.zeros(3, 6), 2, 1, 1.0)
    with pytest.raises(ValueError, match="queries"):
        attribution.attention_scores(torch.zeros(4, 8), torch.zeros(3, 8), 2, 2, 1.0)


def test_top_attended():
    weights = torch.tensor([[0.1, 0.6, 0.3], [0.5, 0.5, 0.0]])
    positions, values = attribution.top_attended(weights, 2)
    assert positions[0].tolist() == [1, 2] and values[0].tolist() == pytest.approx([0.6, 0.3])
    assert attribution.top_attended(weights[:, :1], 3)[0].shape == (2, 1)    # fewer keys than k

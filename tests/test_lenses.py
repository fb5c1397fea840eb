"""Lens math against direct computations on small hand-built tensors."""

import pytest
import torch

from lensapp import lenses


def entropy(log_probs: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """The naive reference: Shannon entropy in nats of log-probabilities along `dim`."""
    return -(log_probs.exp() * log_probs).sum(dim)


def kl_divergence(log_p: torch.Tensor, log_q: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """The naive reference: KL(p || q) in nats from log-probabilities of the same shape."""
    assert log_p.shape == log_q.shape
    return (log_p.exp() * (log_p - log_q)).sum(dim)


def _setup(seed=0, P=7, d=16, V=50, L=4):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(L, P, d, generator=g)
    W = torch.randn(V, d, generator=g)
    w_norm = torch.rand(d, generator=g) + 0.5

    def norm(x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w_norm

    def unembed(x):
        return x @ W.T
    return h, norm, unembed


def test_readout_matches_direct_softmax():
    h, norm, unembed = _setup()
    logits = unembed(norm(h[0]))
    final_logits = unembed(norm(h[-1]))
    final = lenses.FinalDistribution.from_logits(final_logits)
    targets = torch.tensor([3, 17])
    out = lenses.readout(logits, 5, final=final, target_ids=targets)

    log_p = torch.log_softmax(logits, -1)
    log_f = torch.log_softmax(final_logits, -1)
    top = log_p.exp().topk(5, -1)
    assert torch.equal(out["top_ids"], top.indices)
    torch.testing.assert_close(out["top_probs"], top.values)
    torch.testing.assert_close(out["entropy"], entropy(log_p))
    torch.testing.assert_close(out["kl_to_final"], kl_divergence(log_f, log_p), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(out["target_probs"], log_p.exp()[:, targets])
    # rank = 1 + number of tokens strictly more likely
    direct_rank = 1 + (log_p[:, None, :] > log_p[:, targets][:, :, None]).sum(-1)
    assert torch.equal(out["target_ranks"], direct_rank)


def test_target_rank_is_one_for_the_top_token():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]])
    out = lenses.readout(logits, 2, target_ids=torch.tensor([1, 0, 3]))
    assert out["target_ranks"].tolist() == [[1, 4, 2]]
    assert out["top_ids"].tolist() == [[1, 3]]
    torch.testing.assert_close(out["top_probs"].sum(), torch.softmax(logits, -1)[0, [1, 3]].sum())


@pytest.mark.parametrize("n_targets", [1, 2, 5, 7])
def test_target_ranks_fused_and_eager_count_the_same_ties(n_targets):
    """The compiled one-pass count of logits above each target equals the eager per-target count, ties
    included (a tie ranks in the target's favour), whatever the number of targets."""
    g = torch.Generator().manual_seed(n_targets)
    logits = torch.randint(-3, 4, (2, 9, 64), generator=g).float()        # small integers: many ties
    targets = torch.randperm(64, generator=g)[:n_targets]
    t_logits = logits[..., targets]
    lenses.FUSED.ensure()
    if not lenses.FUSED.compiled:
        pytest.skip("torch.compile is not available here: only the eager count runs")
    direct = (logits[..., None, :] > t_logits[..., None]).sum(-1)
    assert torch.equal(lenses.FUSED.above(logits, t_logits), direct)
    assert torch.equal(lenses._above(logits, t_logits), direct)


def test_kl_of_a_distribution_to_itself_is_zero_and_entropy_of_uniform_is_log_v():
    logits = torch.zeros(3, 8)
    final = lenses.FinalDistribution.from_logits(logits)
    out = lenses.readout(logits, 1, final=final)
    torch.testing.assert_close(out["kl_to_final"], torch.zeros(3))
    torch.testing.assert_close(out["entropy"], torch.full((3,), float(torch.log(torch.tensor(8.0)))))


def test_identity_jacobian_reproduces_the_logit_lens_exactly():
    h, norm, unembed = _setup(L=5)
    final = lenses.FinalDistribution.from_logits(unembed(norm(h[-1])))
    J = torch.eye(h.shape[-1]).expand(h.shape[0], -1, -1).to(torch.bfloat16)
    plain = lenses.layer_readouts(h, norm, unembed, 4, final=final)
    jl = lenses.layer_readouts(h, norm, unembed, 4, final=final, J=J)
    for key in plain:
        assert torch.equal(plain[key], jl[key]), key


def test_layer_readouts_equal_per_layer_readouts_whatever_the_chunking(monkeypatch):
    h, norm, unembed = _setup(L=6, P=5)
    g = torch.Generator().manual_seed(1)
    J = torch.randn(6, 16, 16, generator=g) / 4
    final = lenses.FinalDistribution.from_logits(unembed(norm(h[-1])))
    tids = torch.tensor([1, 2])
    whole = lenses.layer_readouts(h, norm, unembed, 3, final=final, J=J, target_ids=tids)
    monkeypatch.setattr(lenses, "ROW_CHUNK", 5)          # one layer per group
    chunked = lenses.layer_readouts(h, norm, unembed, 3, final=final, J=J, target_ids=tids)
    for layer in range(6):
        direct = lenses.readout(unembed(norm(h[layer] @ J[layer].T)), 3, final=final, target_ids=tids)
        for key in direct:
            torch.testing.assert_close(whole[key][layer], direct[key], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(chunked[key][layer], direct[key], atol=1e-5, rtol=1e-5)


def test_continuation_logprob_sums_token_logprobs():
    h, norm, unembed = _setup(L=3, P=4)
    target = torch.tensor([5, 9, 2, 7])
    got = lenses.continuation_logprob(h, norm, unembed, target)
    log_p = torch.log_softmax(unembed(norm(h)), -1)
    want = sum(log_p[:, i, target[i]] for i in range(4))
    torch.testing.assert_close(got, want)


def test_shape_mismatches_raise_instead_of_broadcasting():
    h, norm, unembed = _setup()
    with pytest.raises(ValueError, match="does not fit"):
        lenses.transport(h[0], torch.eye(8))
    with pytest.raises(ValueError, match="does not match"):
        lenses.layer_readouts(h, norm, unembed, 3, J=torch.eye(16).expand(2, -1, -1))
    with pytest.raises(ValueError, match="k=0"):
        lenses.readout(torch.zeros(2, 5), 0)
    with pytest.raises(ValueError, match="does not match"):
        lenses.readout(torch.zeros(2, 5), 1, final=lenses.FinalDistribution.from_logits(torch.zeros(3, 5)))


def test_kl_and_entropy_stay_accurate_at_realistic_logit_scales():
    """Logits of magnitude ~10 over a 49k vocab: a KL of a distribution to itself must read ~0."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 49152, generator=g) * 4 + 10
    final = lenses.FinalDistribution.from_logits(logits)
    out = lenses.readout(logits, 5, final=final)
    assert out["kl_to_final"].abs().max() < 1e-4
    torch.testing.assert_close(out["entropy"], entropy(torch.log_softmax(logits.double(), -1)).float(),
                               atol=1e-4, rtol=1e-5)


def test_an_fp16_transport_that_would_overflow_reads_as_fp32_does():
    """fp16 overflows in h @ J.T (300 x 300 x 4 > 65504): the transport runs in fp32 and each row is scaled
    to fit fp16 before the (scale-invariant) final norm, so the readout equals the fp32 one."""
    def rms_norm(x):                          # as HF's and vLLM's: the sums in fp32, the result in x's dtype
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)

    h = torch.tensor([[300.0, 280.0, -290.0, 310.0], [1.0, -2.0, 0.5, 3.0]])
    J = 300.0 * torch.eye(4) + torch.ones(4, 4)
    assert not torch.isfinite(h.half() @ J.half().T).all()                # the overflow this guards against
    want = rms_norm(lenses.transport(h, J))
    got = rms_norm(lenses.transport(h.half(), J.half()))
    assert got.dtype == torch.float16 and torch.isfinite(got).all()
    torch.testing.assert_close(got.float(), want, rtol=2e-3, atol=2e-3)
    inputs = lenses.lens_inputs(h.half()[None], rms_norm, J.half()[None])
    torch.testing.assert_close(inputs.float(), want, rtol=2e-3, atol=2e-3)

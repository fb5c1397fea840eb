"""Lens math on tensors: transport, top-k, entropy, KL and target scores.

Pure functions of torch tensors. Nothing here knows a model, a backend or a
tokenizer: the final norm and the unembedding arrive as callables, so the same
code runs inside a vLLM worker (called from an nnsight trace), on a
TransformersModel, and in the unit tests on hand-built tensors.

Conventions: `h` is a residual `[..., d_model]`; `logits` are `[rows, vocab]`;
a readout never returns anything vocab-wide, only `[rows, k]` and `[rows]`
tensors, so only small tensors cross back from the worker.
"""

from __future__ import annotations

from typing import Callable

import torch

Unembed = Callable[[torch.Tensor], torch.Tensor]

# Rows of [rows, vocab] logits processed at once. Bounds the worker's peak
# memory (4096 x 152k fp32 is 2.5 GB) while keeping each matmul large.
ROW_CHUNK = 1024
FP16_ROW_PEAK = 2.0 ** 14     # a transported fp16 row's largest entry, with headroom for the norm's sums


def transport(h: torch.Tensor, J: torch.Tensor) -> torch.Tensor:
    """Jacobian-lens transport: h [..., d_model], J [d_model, d_model] -> h @ J.T.

    J[i, j] = d h_final_i / d h_l_j, so J moves a layer-l residual into the
    final layer's basis (first-order).
    """
    if J.ndim != 2 or J.shape[0] != J.shape[1] or J.shape[1] != h.shape[-1]:
        raise ValueError(f"J of shape {tuple(J.shape)} does not fit residual of shape {tuple(h.shape)}")
    if h.dtype == torch.float16:
        return fit_half(h.float() @ J.float().T)
    return h @ J.to(h.dtype).T


def fit_half(x: torch.Tensor) -> torch.Tensor:
    """x [..., d_model] (fp32, transported) -> fp16, each row that would overflow fp16 scaled down to fit.

    fp16 overflows in h @ J.T (a large-norm residual times a J with entries near 1 passes 65504), so an
    fp16 model's transport runs in fp32. What reads it next is the final norm, which is scale-invariant
    per row (RMSNorm, LayerNorm, up to their eps), so a scaled row reads as the unscaled one would.
    """
    peak = x.abs().amax(-1, keepdim=True)
    return (x / (peak / FP16_ROW_PEAK).clamp_min(1)).half()


def readout(
    logits: torch.Tensor,
    k: int,
    *,
    final: FinalDistribution | None = None,
    target_ids: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Summarise logits [rows, vocab] without returning anything vocab-wide.

    Returns float32 tensors (top_ids, target_ranks int64):
      top_ids, top_probs [rows, k]; entropy [rows] (nats);
      kl_to_final [rows] = KL(final || this) and final_top_id [rows] (final's argmax) when `final` (same rows)
      is given;
      target_probs, target_ranks [rows, n_targets] when `target_ids` [n_targets] is given
      (rank 1 = the top token; ties rank in the target's favour).
    Works in log space on row chunks, so peak memory is ROW_CHUNK x vocab.
    """
    if logits.ndim != 2:
        raise ValueError(f"logits must be [rows, vocab], got {tuple(logits.shape)}")
    _check_k(k, logits.shape[-1])
    if final is not None and final.probs.shape != logits.shape:
        raise ValueError(f"final {tuple(final.probs.shape)} does not match logits {tuple(logits.shape)}")
    parts = []
    for i in range(0, logits.shape[0], ROW_CHUNK):
        rows = slice(i, i + ROW_CHUNK)
        part = _readout_chunk(logits[None, rows].float(), k, None if final is None else final[rows], target_ids)
        parts.append({key: v[0] for key, v in part.items()})
    return {key: torch.cat([p[key] for p in parts]) for key in parts[0]}


def layer_readouts(
    h: torch.Tensor,
    norm: Unembed,
    unembed: Unembed,
    k: int,
    *,
    final: FinalDistribution | None = None,
    J: torch.Tensor | None = None,
    target_ids: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Every layer's lens in a few large matmuls: h [L, P, d_model] -> readout fields [L, P, ...].

    J [L, d_model, d_model] (optional) transports each layer first (the Jacobian lens).
    `final` covers the P positions and is shared by every layer. Layers are unembedded in
    groups of about ROW_CHUNK rows: large enough for an efficient matmul, small enough that
    the [rows, vocab] logits stay a few hundred MB.
    """
    if h.ndim != 3:
        raise ValueError(f"h must be [layers, positions, d_model], got {tuple(h.shape)}")
    L, P, d = h.shape
    if J is not None and tuple(J.shape) != (L, d, d):
        raise ValueError(f"J {tuple(J.shape)} does not match h {tuple(h.shape)}: expected ({L}, {d}, {d})")
    if final is not None and final.probs.shape[0] != P:
        raise ValueError(f"final covers {final.probs.shape[0]} positions, h has {P}")
    group = max(1, ROW_CHUNK // max(P, 1))
    parts = []
    for a in range(0, L, group):
        x = lens_inputs(h[a:a + group], norm, None if J is None else J[a:a + group])
        logits = unembed(x).float().reshape(x.shape[0] // P, P, -1)
        parts.append(readouts_from_logits(logits, k, final=final, target_ids=target_ids))
    return {key: torch.cat([p[key] for p in parts]) for key in parts[0]}


def lens_inputs(h: torch.Tensor, norm: Unembed, J: torch.Tensor | None = None) -> torch.Tensor:
    """h [L, P, d_model] -> [L * P, d_model]: what the unembedding reads for each layer and position,
    transported first when J [L, d_model, d_model] is given (the Jacobian lens), then normed."""
    L, P, d = h.shape
    if J is not None and h.dtype == torch.float16:            # see fit_half
        h = fit_half(torch.einsum("lpd,led->lpe", h.float(), J.float()))
    elif J is not None:
        h = torch.einsum("lpd,led->lpe", h, J.to(h.dtype))   # h @ J.T per layer
    return norm(h.reshape(L * P, d))


def readouts_from_logits(
    logits: torch.Tensor,
    k: int,
    *,
    final: FinalDistribution | None = None,
    target_ids: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """logits [L, P, vocab] (one unembedded row per layer and position) -> readout fields [L, P, ...]."""
    _check_k(k, logits.shape[-1])
    return _readout_chunk(logits.float(), k, final, target_ids)


def continuation_logprob(
    h: torch.Tensor, norm: Unembed, unembed: Unembed, target_ids: torch.Tensor, J: torch.Tensor | None = None
) -> torch.Tensor:
    """log P(whole target | prompt) under each layer's lens: h [L, m, d_model] -> [L].

    h holds each layer's residual at the prompt's last position and the target's first m-1
    positions (the prompt continued by the target), target_ids [m] the target's tokens.
    """
    L, m, d = h.shape
    if target_ids.shape != (m,):
        raise ValueError(f"target_ids {tuple(target_ids.shape)} does not match h {tuple(h.shape)}")
    if J is not None:
        h = torch.einsum("lpd,led->lpe", h, J.to(h.dtype))
    log_p = torch.log_softmax(unembed(norm(h.reshape(L * m, d))).float(), dim=-1).reshape(L, m, -1)
    return log_p.gather(-1, target_ids.view(1, m, 1).expand(L, m, 1)).squeeze(-1).sum(-1)


def _check_k(k: int, vocab: int) -> None:
    if not 1 <= k <= vocab:
        raise ValueError(f"k={k} must be in 1..{vocab}")


class FinalDistribution:
    """The model's own next-token distribution at each position, kept for KL(final || lens).

    KL(f || l) = sum_v f (log f - log l) = log_z_l - H(f) - f . logits_l, so only the
    probabilities and their entropy are needed, not a second log-softmax per layer.
    probs [P, vocab] broadcasts against logits [..., P, vocab]; top_id [P]: its argmax, the token whose
    decision a readout's strip shows (`results/decided.py`).
    """

    def __init__(self, probs: torch.Tensor, entropy: torch.Tensor, top_id: torch.Tensor | None = None):
        self.probs, self.entropy = probs, entropy
        self.top_id = probs.argmax(-1) if top_id is None else top_id

    @classmethod
    def from_logits(cls, logits: torch.Tensor) -> FinalDistribution:
        log_p = torch.log_softmax(logits.float(), dim=-1)
        p = log_p.exp()
        return cls(p, -(p * log_p).sum(-1), log_p.argmax(-1))

    def __getitem__(self, rows) -> FinalDistribution:
        return FinalDistribution(self.probs[rows], self.entropy[rows], self.top_id[rows])


def _exp_stats(logits: torch.Tensor, m: torch.Tensor):
    """sum_v e_v and sum_v e_v z_v, with z = logits - m and e = exp(z): [n, P, vocab] -> [n, P] each."""
    z = logits - m
    e = torch.exp(z)
    return e.double().sum(-1), (e * z).double().sum(-1)


def _final_cross(logits: torch.Tensor, m: torch.Tensor, probs: torch.Tensor):
    """sum_v f_v z_v for the final distribution f [P, vocab] against logits [n, P, vocab] -> [n, P]."""
    return (probs * (logits - m)).double().sum(-1)


def _above(logits: torch.Tensor, t_logits: torch.Tensor):
    """How many logits beat each target's: logits [n, P, vocab], t_logits [n, P, T] -> [n, P, T] (int64).
    Compiled, all targets are one fused pass; eagerly, one pass per target (never a [n, P, T, vocab] mask)."""
    if torch.compiler.is_compiling():
        return (logits.unsqueeze(-2) > t_logits.unsqueeze(-1)).sum(-1)
    return torch.stack([(logits > t_logits[..., j:j + 1]).sum(-1) for j in range(t_logits.shape[-1])], dim=-1)


class _Fused:
    """torch.compile'd versions of the three vocab-wide reductions, with an eager fallback.

    Eager PyTorch makes a pass over [rows, vocab] per op (subtract, exp, multiply, sum: ~0.65 s per
    1024 x 49k rows on one core); compiled, each function is one fused pass (~0.07 s), which is what
    brings the lens near its unembedding floor. A target's rank is the same story, worse: eagerly a
    compare and a count per target (~0.18 s per 1024 rows each, more than the unembedding itself with five
    targets), compiled one pass for all of them (~0.02 s for five). Sums accumulate in float64, so entropy and KL stay
    accurate to ~1e-7 (a float32 running sum over 49k terms drifts by ~1e-4). If compiling is not
    possible here (no C++ compiler, an old GPU), the same functions run eagerly.
    """

    def __init__(self):
        self.exp_stats, self.final_cross, self.above, self.compiled = _exp_stats, _final_cross, _above, False
        self.tried = False

    def ensure(self):
        if self.tried:
            return
        self.tried = True
        try:
            exp_stats = torch.compile(_exp_stats, dynamic=True)
            final_cross = torch.compile(_final_cross, dynamic=True)
            above = torch.compile(_above, dynamic=True)
            probe = torch.zeros(2, 2, 8)
            exp_stats(probe, probe[..., :1]), final_cross(probe, probe[..., :1], probe[0]), above(probe, probe[..., :2])
        except Exception as e:  # noqa: BLE001 - any failure means: stay eager
            import logging

            logging.getLogger(__name__).warning("fused readout unavailable, running eagerly: %s", e)
            return
        self.exp_stats, self.final_cross, self.above, self.compiled = exp_stats, final_cross, above, True


FUSED = _Fused()


def _readout_chunk(logits, k, final, target_ids):
    """logits [n, P, vocab] float32 -> readout fields [n, P, k] / [n, P]; final covers the P positions.

    With m the row max (from top-k), z = logits - m, s = sum exp(z):
      log_z = m + log s;  H = log s - sum(e z) / s;  KL(f || p) = log s - H(f) - sum(f z).
    """
    FUSED.ensure()
    top = logits.topk(k, dim=-1)
    m = top.values[..., :1]                                       # the row max
    s, ez = FUSED.exp_stats(logits, m)
    log_s = s.log()
    log_z = m[..., 0] + log_s.float()
    out = {
        "top_ids": top.indices,
        "top_probs": (top.values - log_z[..., None]).exp(),
        "entropy": (log_s - ez / s).float(),
    }
    if final is not None:
        cross = FUSED.final_cross(logits, m, final.probs.to(logits.dtype))
        out["kl_to_final"] = (log_s - final.entropy.double() - cross).float().clamp_min(0.0)
        # [n, P] like every field (the same row n times), so parts of a readout concatenate by layers
        out["final_top_id"] = final.top_id.to(top.indices.device).expand(logits.shape[0], -1).clone()
    if target_ids is not None and target_ids.numel():
        t_logits = logits[..., target_ids]                              # [n, P, n_targets]
        out["target_probs"] = (t_logits - log_z[..., None]).exp()
        out["target_ranks"] = 1 + FUSED.above(logits, t_logits)
    return out

"""Direct logit attribution and attention patterns, as tensor math.

Pure functions of torch tensors, like `lenses`: nothing here knows a model, a backend or a tokenizer. The
engine calls them inside a request's trace (`engine/run/components_trace.py`) on what it read there.

The residual at the last block is a sum of parts: h = embed + sum_l (attn_l + mlp_l). The final norm is
not linear, but with its scale frozen at the actual final residual it is affine:

    norm(x) ~ g * P x / sigma(h) + beta        P: centring (LayerNorm) or the identity (RMSNorm);
                                                sigma(h) = sqrt(mean((P h)^2) + eps), of the actual h

so the logit of token t (minus a foil f), w = W_U[t] - W_U[f], splits exactly into one term per part:

    w . norm(h) = sum_parts u . c + beta . w,   u = P (g * w) / sigma(h)

(P is symmetric, so g * w can be centred instead of each part). `u . c` is a part's direct effect on the
logit: what it writes straight into the final residual, read through the frozen norm. It is not what the
part causes downstream (later layers read it too) and not what the logit would be without it (the norm's
scale would change). An attention layer's output is a sum over its heads, sum_h W_O[:, h] z_h (+ b_O), so
each head's term is `u . W_O[:, h] z_h` (`split_heads`). A norm inside the block after the attention (Gemma 2's
post-attention norm) is frozen the same way, at the attention's actual output.

Attention weights are recomputed from the rotated queries and keys the attention kernel receives, with
the family's scale, soft-capping (`cap * tanh(s / cap)`) and sliding window (a query attends to the
`window` newest keys, itself included), as vLLM's kernels apply them.
"""

from __future__ import annotations

import torch


def frozen_norm_direction(h: torch.Tensor, w: torch.Tensor, weight: torch.Tensor | None, eps: float,
                          centred: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """h [d_model] (the actual final residual), w [d_model] (unembedding row, or target minus foil) ->
    (u [d_model], sigma []): a part c's direct effect on the logit is u . c (module docstring).
    weight: the norm's effective multiplier g (Gemma's 1 + weight), or None for none."""
    if h.shape != w.shape or h.ndim != 1:
        raise ValueError(f"h {tuple(h.shape)} and w {tuple(w.shape)} must be the same [d_model]")
    h, w = h.float(), w.float()
    x = h - h.mean() if centred else h
    sigma = torch.sqrt(x.pow(2).mean() + eps)
    gw = w if weight is None else weight.float() * w
    if centred:
        gw = gw - gw.mean()
    return gw / sigma, sigma


def rms_scale(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., d] -> [...]: an RMSNorm's divisor sqrt(mean(x^2) + eps), at which a norm inside a block is frozen."""
    return torch.sqrt(x.float().pow(2).mean(-1) + eps)


def split_heads(z: torch.Tensor, n_heads: int) -> torch.Tensor:
    """z [n_heads * head_dim] (the output projection's input at one position) -> [n_heads, n_heads * head_dim]:
    row h holds head h's output in its place and zeros elsewhere, so the projection (without its bias)
    maps row h to head h's part of the attention's output, W_O[:, h] z_h."""
    if z.ndim != 1 or z.shape[0] % n_heads:
        raise ValueError(f"z {tuple(z.shape)} does not split into {n_heads} heads")
    d = z.shape[0] // n_heads
    mask = torch.zeros(n_heads, n_heads, d, dtype=torch.bool, device=z.device)
    mask[torch.arange(n_heads), torch.arange(n_heads)] = True
    return torch.where(mask, z.reshape(1, n_heads, d), torch.zeros((), dtype=z.dtype, device=z.device)).reshape(
        n_heads, -1)


def attention_scores(q: torch.Tensor, k: torch.Tensor, n_heads: int, n_kv_heads: int, scale: float,
                     softcap: float | None = None, window: int | None = None) -> torch.Tensor:
    """Causal attention weights: q [Q, n_heads * head_dim] (queries at the last Q positions of the T keys),
    k [T, n_kv_heads * head_dim] -> [n_heads, Q, T], each row summing to 1 over the keys it may see.

    Grouped-query attention: head h reads key head h // (n_heads // n_kv_heads). softcap: scores become
    cap * tanh(s / cap) before the mask. window: query i sees keys j with i - window < j <= i."""
    Q, T = q.shape[0], k.shape[0]
    if n_heads % n_kv_heads or q.shape[-1] % n_heads or k.shape[-1] != q.shape[-1] // n_heads * n_kv_heads:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} do not fit {n_heads} heads over "
                         f"{n_kv_heads} key heads")
    if Q > T:
        raise ValueError(f"{Q} queries for {T} keys: queries are the last positions of the keys")
    d = q.shape[-1] // n_heads
    qh = q.float().reshape(Q, n_heads, d).transpose(0, 1)              # [H, Q, d]
    kh = k.float().reshape(T, n_kv_heads, d).transpose(0, 1)           # [KV, T, d]
    kh = kh.repeat_interleave(n_heads // n_kv_heads, dim=0)            # [H, T, d]
    s = (qh @ kh.transpose(1, 2)) * scale                              # [H, Q, T]
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    query = torch.arange(T - Q, T, device=s.device)[:, None]
    key = torch.arange(T, device=s.device)[None, :]
    seen = key <= query
    if window:
        seen &= key > query - window
    return torch.softmax(s.masked_fill(~seen, float("-inf")), dim=-1)


def top_attended(weights: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """weights [..., T] -> (positions [..., k'], weights [..., k']) of the k' = min(k, T) most attended keys."""
    top = weights.topk(min(k, weights.shape[-1]), dim=-1)
    return top.indices, top.values

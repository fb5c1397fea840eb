"""Interventions on the residual stream, as tensor math: edits (steer, ablate, patch) and directions.

Pure functions of torch tensors, like `lenses`: nothing here knows a model, a backend or a
tokenizer. The engine applies edits inside a request's trace (`engine/run/trace.py`) through
`edit_rows` and `edit_delta` / `apply_edit`; the service builds the vectors it sends with the
direction functions, from weights `engine/run/weights.py` reads off disk.

Edits, on the stream s [n, d_model] at the rows they touch (u = vector / ||vector||):

    add             s + vector
    project_out     s - (s . u) u                 (ablate a direction)
    set_component   s + (value - s . u) u         (set the component along u: mean ablation)
    replace         the given rows                (activation patching)

A zero vector projects out nothing and sets nothing (u is taken as 0, not NaN).

Directions, for token t (the lens reads logits = W_U norm(x), norm(x) = g * x / rms(x)):

    logit lens      w_t = g * W_U[t]              (Gemma's norms multiply by 1 + g; LayerNorm by g)
    Jacobian lens   J_l^T w_t = w_t @ J_l         (its readout is norm(h @ J_l^T), then W_U)

so the logit of t moves with w_t . s (per unit of 1 / rms). `scaled` turns a direction into a vector
of a chosen size: alpha times the layer's typical residual norm (`typical_norm`).
"""

from __future__ import annotations

from typing import Sequence

import torch

KINDS = ("add", "project_out", "set_component", "replace")


def unit(v: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """v / ||v|| along `dim` (same shape); a zero vector stays zero."""
    n = v.norm(dim=dim, keepdim=True)
    return torch.where(n > 0, v / n.clamp_min(torch.finfo(v.dtype).tiny), torch.zeros_like(v))


def edit_delta(h: torch.Tensor, kind: str, vector: torch.Tensor, value: float = 0.0) -> torch.Tensor:
    """What an edit adds to the stream rows h [n, d_model]: new - old, [n, d_model].

    vector: [d_model], or [n, d_model] for "replace" (row i replaces h[i]). For "add" the delta is
    the vector itself (not (h + v) - h), so a zero vector is an exact no-op.
    """
    if h.ndim != 2:
        raise ValueError(f"h must be [n, d_model], got {tuple(h.shape)}")
    if kind == "replace":
        if vector.shape != h.shape:
            raise ValueError(f"replace: vector {tuple(vector.shape)} does not match rows {tuple(h.shape)}")
        return vector.to(h.dtype) - h
    if vector.shape != h.shape[-1:]:
        raise ValueError(f"{kind}: vector {tuple(vector.shape)} does not match rows {tuple(h.shape)}")
    v = vector.to(h.dtype)
    if kind == "add":
        return v.expand_as(h)
    u = unit(v)
    along = h @ u                                                   # [n]
    if kind == "project_out":
        return -along[:, None] * u
    if kind == "set_component":
        return (value - along)[:, None] * u
    raise ValueError(f"unknown edit kind {kind!r}; one of {KINDS}")


def apply_edit(h: torch.Tensor, kind: str, vector: torch.Tensor, value: float = 0.0) -> torch.Tensor:
    """h [n, d_model] -> the edited rows [n, d_model] (a new tensor; "replace" copies the vector exactly)."""
    if kind == "replace":
        edit_delta(h, kind, vector)                                  # the shape check
        return vector.to(h.dtype).clone()
    return h + edit_delta(h, kind, vector, value)


def edit_rows(positions: Sequence[int] | None, generated: bool, first: int, n_rows: int,
              prompt_len: int) -> tuple[list[int], list[int]]:
    """Which rows of one forward step an edit touches, and which vector row each takes (for "replace").

    The step's rows are positions first .. first + n_rows - 1 of the sequence (a prompt: 0..P-1; a
    generated token: its own position; a prompt continued by a target: 0..P+m-2). Positions below
    prompt_len are the prompt's: edited when `positions` is None (vector row = the position) or lists
    them (vector row = its index in `positions`). Later positions are generated (or a continuation's
    target): edited only when `generated`. Returns (rows of the step, vector rows), in step order.
    """
    rows, source = [], []
    index = {p: i for i, p in enumerate(positions)} if positions is not None else None
    for r in range(n_rows):
        pos = first + r
        if pos < prompt_len:
            if index is None:
                rows.append(r)
                source.append(pos)
            elif pos in index:
                rows.append(r)
                source.append(index[pos])
        elif generated:
            rows.append(r)
            source.append(0)
    return rows, source


def typical_norm(h: torch.Tensor) -> torch.Tensor:
    """h [..., P, d_model] -> [...]: the median over positions 1..P-1 of ||h|| (all of them when P == 1).

    Position 0 is left out: it is an attention sink whose norm is many times the others'. An even
    count takes the mean of the two middle values.
    """
    if h.ndim < 2:
        raise ValueError(f"h must be [..., positions, d_model], got {tuple(h.shape)}")
    n = h.float().norm(dim=-1)
    if n.shape[-1] > 1:
        n = n[..., 1:]
    return n.quantile(0.5, dim=-1)


def norm_scale(weight: torch.Tensor, plus_one: bool = False) -> torch.Tensor:
    """The final norm's weight [d_model] -> what it multiplies by (Gemma's norms: 1 + weight)."""
    return weight.float() + 1 if plus_one else weight.float()


def logit_direction(unembed_rows: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """W_U rows [..., d_model] and the final norm's scale [d_model] (`norm_scale`) -> w = scale * W_U[t]."""
    if unembed_rows.shape[-1:] != scale.shape:
        raise ValueError(f"unembedding rows {tuple(unembed_rows.shape)} do not match scale {tuple(scale.shape)}")
    return unembed_rows.float() * scale.float()


def jacobian_direction(w: torch.Tensor, J: torch.Tensor) -> torch.Tensor:
    """A logit direction w [..., d_model] and layer l's J [d_model, d_model] -> J^T w = w @ J [..., d_model]."""
    if J.ndim != 2 or J.shape[0] != J.shape[1] or J.shape[0] != w.shape[-1]:
        raise ValueError(f"J {tuple(J.shape)} does not fit direction {tuple(w.shape)}")
    return w.float() @ J.float()


def difference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a - b: the direction from token b to token a (e.g. " Rome" minus " Paris"), [d_model]."""
    if a.shape != b.shape:
        raise ValueError(f"directions differ in shape: {tuple(a.shape)} vs {tuple(b.shape)}")
    return a.float() - b.float()


def scaled(direction: torch.Tensor, alpha: float, norm: float | torch.Tensor) -> torch.Tensor:
    """unit(direction) * alpha * norm: a vector alpha times the layer's typical residual norm long."""
    return unit(direction.float()) * (float(alpha) * float(norm))

"""One prompt's estimate of every layer's average Jacobian, J_l = E[d h_final / d h_l].

h_l is the output of decoder block l (resid_post), h_final the output of the last block, before
the final norm; source layers are 0..n_layers-2. For a prompt of n tokens the valid positions are
[skip, n-1): the first `skip` are attention sinks and the last has no next token. The estimate is

    J_l[i, :] = mean_{s valid} sum_{t valid} d h_final[t, i] / d h_l[s, :]

Reverse mode: a cotangent u (a row vector over output dims) at every valid target position gives, in one
`autograd.grad`, the row u^T J_l of every source layer at once. The exact estimate runs the d_model one-hot
rows in ceil(d_model / dim_batch) backward passes, over one forward of the prompt replicated `dim_batch`
times (copy b of a pass carries row b), or of one copy with the rows batched through the backward
(`batched`: autograd's `is_grads_batched`, a vmap over it).

Only the valid positions need a graph. Causal attention sends a source position's influence only to
itself and later positions, so no gradient that reaches a valid source passes through a position before
`skip`, and the last position carries none (no valid target at or after it). With `prefix_cache` the first
`skip` positions run once without grad, as a KV cache, and the graph covers the n-skip-1 valid ones: the
same J to rounding, at (n-skip-1)/n of the backward's work (47/64 for T=64, skip 16).

The sketched estimate (`probes` = k < d_model) runs k rows instead of d_model: the k columns of a
random orthonormal Q [d_model, k] (Haar), and, around a control C (the running mean of earlier
prompts; it only lowers the variance),

    J_hat = C + (d/k) Q Q^T (J - C),        E[(d/k) Q Q^T] = I, so E[J_hat] = J for any fixed C.

It costs k/d of the exact rows and adds about (d/k - 1) ||J - C||_F^2 of variance per prompt; at
equal compute that is no better than more exact prompts (bench/RESULTS.md has the measurement).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch

from ..engine.run.families import Layout, find, residual
from .settings import FitError


def decoder_layers(module, layout: Layout) -> torch.nn.ModuleList:
    """The decoder blocks of an HF causal LM, where its family keeps them."""
    try:
        layers = find(module, layout.blocks)
    except AttributeError:
        layers = None
    if not isinstance(layers, torch.nn.ModuleList) or len(layers) < 2:
        raise FitError(f"{type(module).__name__} has no `{layout.blocks}` with at least two decoder blocks")
    return layers


@dataclass
class PromptGraph:
    """One forward's autograd graph: the target h_final and every source layer's h_l, [copies, m, d_model]
    over the m positions `valid` selects (all of them under the prefix cache)."""

    target: torch.Tensor
    sources: list
    valid: slice


def prompt_graph(model, layout: Layout, ids: torch.Tensor, skip: int, copies: int, *,
                 prefix_cache: bool = True) -> PromptGraph:
    """The forward of `ids` [n] as `copies` identical rows, with a graph from block 0's output (made a leaf
    there: nothing below the earliest source layer needs grad) to the last block's. `model` is nnsight's
    TransformersModel; its parameters must not require grad (`frozen`). Needs n > skip + 1."""
    import nnsight

    n_layers = len(decoder_layers(model._module, layout))
    n = ids.shape[0]
    if n <= skip + 1:
        raise ValueError(f"a prompt of {n} tokens has no valid position with skip={skip}")
    ids = ids.to(next(model._module.parameters()).device)
    kwargs = {"use_cache": False}
    if prefix_cache and skip:
        try:
            with torch.no_grad():
                kwargs["past_key_values"] = model._module(input_ids=ids[:skip].expand(copies, -1),
                                                          use_cache=True).past_key_values
        except (TypeError, ValueError, AttributeError) as e:
            raise FitError(f"{type(model._module).__name__} gives no KV cache to fit from ({type(e).__name__}): "
                           "fit with --no-prefix-cache") from e
    if prefix_cache:
        ids, valid = ids[skip:n - 1], slice(None)
    else:
        valid = slice(skip, n - 1)
    with torch.enable_grad(), model.trace(ids.expand(copies, -1), **kwargs):
        blocks = find(model, layout.blocks)
        first = blocks[0].output
        h0 = residual(first, layout).detach().requires_grad_(True)
        blocks[0].output = (h0, *first[1:]) if isinstance(first, tuple) else h0
        acts = [h0]
        for i in range(1, n_layers):
            acts.append(residual(blocks[i].output, layout))
        acts = nnsight.save(acts)
    return PromptGraph(target=acts[-1], sources=acts[:-1], valid=valid)


def jacobian_rows(graph: PromptGraph, directions: torch.Tensor, *, retain: bool) -> torch.Tensor:
    """directions U [r, d_model] -> U @ J_l for every source layer, [n_sources, r, d_model] (fp32, CPU), in one
    backward pass: row b is carried by copy b of a replicated forward (r <= copies), or batched through the
    backward of a single copy (autograd's is_grads_batched)."""
    target, r = graph.target, directions.shape[0]
    u = directions.to(target.dtype).to(target.device)[:, None, :]                   # [r, 1, d_model]
    if target.shape[0] == 1 and r > 1:
        cotangent = torch.zeros((r, *target.shape), dtype=target.dtype, device=target.device)
        cotangent[:, 0, graph.valid] = u
        grads = torch.autograd.grad(target, graph.sources, grad_outputs=cotangent, retain_graph=retain,
                                    is_grads_batched=True)
        return torch.stack([g[:, 0, graph.valid].float().mean(1).cpu() for g in grads])
    if r > target.shape[0]:
        raise ValueError(f"{r} rows in one pass over {target.shape[0]} copies")
    cotangent = torch.zeros_like(target)
    cotangent[:r, graph.valid] = u
    grads = torch.autograd.grad(target, graph.sources, grad_outputs=cotangent, retain_graph=retain)
    return torch.stack([g[:r, graph.valid].float().mean(1).cpu() for g in grads])


def prompt_jacobian(model, layout: Layout, ids: torch.Tensor, skip: int, dim_batch: int, *,
                    prefix_cache: bool = True, batched: bool = True, probes: int = 0,
                    control: torch.Tensor | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """ids [n] -> J [n_layers-1, d_model, d_model] (fp32, CPU) for one prompt; see the module docstring.

    Exact unless 0 < probes < d_model: then the sketched estimate around `control` (zero when None), its
    probes drawn from `generator`.
    """
    graph = prompt_graph(model, layout, ids, skip, 1 if batched else dim_batch, prefix_cache=prefix_cache)
    d_model = graph.target.shape[-1]
    sketched = 0 < probes < d_model
    if sketched:
        g = torch.randn(d_model, probes, generator=generator, dtype=torch.float64)
        q, r = torch.linalg.qr(g)
        directions = (q * torch.sign(torch.diagonal(r))).T.float()                  # [k, d]: Haar, orthonormal rows
    else:
        directions = torch.eye(d_model)
    rows = []
    passes = math.ceil(directions.shape[0] / dim_batch)
    for p in range(passes):
        rows.append(jacobian_rows(graph, directions[p * dim_batch:(p + 1) * dim_batch], retain=p < passes - 1))
    rows = torch.cat(rows, dim=1)                                                   # [n_sources, k, d]
    if not sketched:
        return rows
    if control is None:
        return (d_model / probes) * (directions.T @ rows)
    control = control.float()
    return control + (d_model / probes) * (directions.T @ (rows - directions @ control))   # C + (d/k) Q Q^T (J - C)


@contextlib.contextmanager
def frozen(module):
    """Eval mode and no parameter grads for the duration; the caller's flags come back after."""
    flags = [(p, p.requires_grad) for p in module.parameters()]
    training = module.training
    module.eval()
    for p, _ in flags:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)
        module.train(training)

"""One prompt's estimate of every layer's average Jacobian, J_l = E[d h_final / d h_l].

h_l is the output of decoder block l (resid_post), h_final the output of the last block, before
the final norm; source layers are 0..n_layers-2. For a prompt of n tokens the valid positions are
[skip, n-1): the first `skip` are attention sinks and the last has no next token. The estimate is

    J_l[i, :] = mean_{s valid} sum_{t valid} d h_final[t, i] / d h_l[s, :]

from one forward of the prompt replicated `dim_batch` times and ceil(d_model / dim_batch) backward
passes: copy b of pass p carries a one-hot cotangent on output dim p * dim_batch + b at every valid
target position, so one `autograd.grad` yields that row for all source layers at once.
"""

from __future__ import annotations

import contextlib
import math

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


def prompt_jacobian(model, layout: Layout, ids: torch.Tensor, skip: int, dim_batch: int) -> torch.Tensor:
    """ids [n] -> J [n_layers-1, d_model, d_model] (fp32, CPU) for one prompt; see the module docstring.

    `model` is nnsight's TransformersModel: one trace reads every block's output (the graph starts
    at block 0's, made a leaf there, since nothing below the earliest source layer needs grad), and
    the backward passes run on those saved tensors. Needs n > skip + 1; parameters must not require
    grad (`frozen` sees to that).
    """
    import nnsight

    n_layers = len(decoder_layers(model._module, layout))
    n = ids.shape[0]
    if n <= skip + 1:
        raise ValueError(f"a prompt of {n} tokens has no valid position with skip={skip}")
    device = next(model._module.parameters()).device
    with torch.enable_grad(), model.trace(ids.to(device).expand(dim_batch, -1), use_cache=False):
        blocks = find(model, layout.blocks)
        first = blocks[0].output
        h0 = residual(first, layout).detach().requires_grad_(True)
        blocks[0].output = (h0, *first[1:]) if isinstance(first, tuple) else h0
        acts = [h0]
        for i in range(1, n_layers):
            acts.append(residual(blocks[i].output, layout))
        acts = nnsight.save(acts)
    target, sources = acts[-1], acts[:-1]
    d_model = target.shape[-1]
    valid = slice(skip, n - 1)
    J = torch.zeros(len(sources), d_model, d_model)
    cotangent = torch.zeros_like(target)
    passes = math.ceil(d_model / dim_batch)
    for p in range(passes):
        rows = range(p * dim_batch, min(d_model, (p + 1) * dim_batch))
        cotangent.zero_()
        for b, i in enumerate(rows):
            cotangent[b, valid, i] = 1
        grads = torch.autograd.grad(target, sources, grad_outputs=cotangent, retain_graph=p < passes - 1)
        for layer, g in enumerate(grads):
            J[layer, rows.start:rows.stop] = g[:len(rows), valid].float().mean(1).cpu()
    return J


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

"""The components readout inside a trace: who wrote one logit, and where each head looked.

Runs inside an nnsight trace like `trace.py`'s bodies (on vLLM: in the engine's worker), on one prompt.
At every block, in forward order, it reads at the spec's position what each part added to the residual
stream (`anatomy`: the attention's output, each head's slice of the output projection's input, the MLP's
output) and where the attention looked from there; after the last block it freezes the final norm at the
actual final residual and reads each part's direct effect on the logit (`lensapp.attribution`). Only
[layers, heads]-sized tensors and one layer's [heads, P, P] pattern come back.

Attention weights: on vLLM, recomputed from the rotated queries and keys the attention kernel receives,
with the kernel's own scale, soft-capping and sliding window (vLLM's kernels never form the weights); on
transformers, the attention module's own weights from its eager path (the backend switches it there for
the trace). Under tensor parallelism each rank holds some heads: it reads their terms through its own slice of
the output projection (nnsight hands the projection's input whole), and the terms and weights are gathered
(`Site.gather_heads`). Pipeline parallelism is refused before a spec is made (`anatomy.refusal`).

Every value kept is copied at once: vLLM's fused add-norm overwrites its inputs in place further on.
"""

from __future__ import annotations

import torch

from ... import attribution
from .anatomy import Anatomy, anatomy_of, norm_affine, weight_o
from .families import final_norm, find, first_item, residual
from .protocol import ComponentsSpec


def keep(x: torch.Tensor) -> torch.Tensor:
    """A float32 copy (see the module docstring)."""
    return x.detach().to(torch.float32, copy=True)


def rows(x: torch.Tensor) -> torch.Tensor:
    """[..., tokens, n] (HF's batch of one, or vLLM's packed tokens) -> [tokens, n]."""
    return x.reshape(-1, x.shape[-1])


def components_trace(model, site, spec: ComponentsSpec) -> dict:
    """The trace body: {"logit", "embed", "attn", "mlp", "heads", "attn_bias", "bias", "sigma", "top_positions",
    "top_weights"} and "pattern" where the spec asks (shapes: `protocol.ComponentsOutput`)."""
    anatomy = anatomy_of(spec.model_type)
    if anatomy is None:
        raise ValueError(f"no anatomy for model type {spec.model_type!r}")
    blocks = find(model, site.layout.blocks)
    reads = [read_block(blocks[layer], anatomy, site, spec, layer) for layer in range(spec.n_layers)]
    out = attribute(model, site, spec, anatomy, reads)
    tops = torch.stack([r["row"] for r in reads])                              # [L, H_local, P + 1]
    positions, weights = attribution.top_attended(tops, spec.top_k)
    out["top_positions"], out["top_weights"] = gathered(site, positions, 1), gathered(site, weights, 1)
    pattern = next((r["pattern"] for r in reads if "pattern" in r), None)
    if pattern is not None:
        out["pattern"] = gathered(site, pattern, 0)
    return out


def read_block(block, anatomy: Anatomy, site, spec: ComponentsSpec, layer: int) -> dict:
    """What block `layer` adds at the spec's position, read in forward order: the attention's weights from
    there ("row" [H_local, P + 1]; "pattern" [H_local, P + 1, P + 1] at the patterns layer), the heads'
    outputs "z", the attention's raw output and its part, the MLP's part, and the stream after the block."""
    p, full = spec.position, layer == spec.patterns_layer
    out = {}
    if site.recompute_attention:
        args = find(block, anatomy.kernel).inputs[0]                          # (query, key, value, ...)
        weights = kernel_weights(find(block, anatomy.kernel)._module, rows(args[0]), rows(args[1]), p, full)
    out["z"] = rows(find(block, anatomy.o_proj).input)[p].detach().clone()     # in the model's dtype
    attn = find(block, anatomy.attn).output
    if not site.recompute_attention:
        if not isinstance(attn, tuple) or attn[1] is None:
            raise RuntimeError("the attention returned no weights: the trace needs its eager path")
        weights = keep(attn[1][0, :, :p + 1, :p + 1]) if full else keep(attn[1][0, :, p, :p + 1])
    out["row"] = weights[:, -1] if full else weights
    if full:
        out["pattern"] = weights
    out["attn_raw"] = keep(rows(first_item(attn))[p])
    out["attn"] = (keep(rows(first_item(find(block, anatomy.attn_norm).output))[p]) if anatomy.attn_norm
                   else out["attn_raw"])
    out["mlp"] = keep(rows(first_item(find(block, anatomy.mlp_part).output))[p])
    stream = rows(residual(block.output, site.layout))[p]
    out["stream"] = stream.detach().clone()                   # in the model's dtype: the final norm reads it
    return out


def kernel_weights(kernel, q: torch.Tensor, k: torch.Tensor, p: int, full: bool) -> torch.Tensor:
    """vLLM's attention kernel's weights from position p ([H_local, p + 1]; all of 0..p with `full`:
    [H_local, p + 1, p + 1]), recomputed from the rotated queries and keys it receives, with its own
    scale, soft-capping and sliding window."""
    impl = kernel.impl
    if getattr(impl, "alibi_slopes", None) is not None or getattr(kernel, "has_sink", False):
        raise ValueError("this model's attention has ALiBi slopes or sinks, which the components readout "
                         "does not recompute")
    cap = float(getattr(impl, "logits_soft_cap", None) or 0.0) or None
    window = kernel.sliding_window if isinstance(kernel.sliding_window, int) and kernel.sliding_window > 0 else None
    queries = q[:p + 1] if full else q[p:p + 1]
    weights = attribution.attention_scores(queries, k[:p + 1], kernel.num_heads, kernel.num_kv_heads,
                                           float(impl.scale), softcap=cap, window=window)
    return weights if full else weights[:, 0]


def attribute(model, site, spec: ComponentsSpec, anatomy: Anatomy, reads: list[dict]) -> dict:
    """Each part's direct effect on the logit, through the final norm frozen at the actual final residual."""
    h = reads[-1]["stream"]
    ids = [spec.target_id] + ([spec.foil_id] if spec.foil_id is not None else [])
    head_rows = unembedding_rows(model, site, ids).float()
    w = head_rows[0] - head_rows[1] if spec.foil_id is not None else head_rows[0]
    logit = final_norm(model, site.layout)(h[None])[0].float() @ w
    g, beta, eps, centred = norm_affine(find(model, site.layout.norm)._module, spec.norm_plus_one)
    u, sigma = attribution.frozen_norm_direction(h.float(), w, g, eps, centred)
    blocks = find(model, site.layout.blocks)
    heads, attn_bias = [], []
    for layer, r in enumerate(reads):
        u_layer = u
        if anatomy.attn_norm:                 # a norm after the attention, frozen at the attention's output
            g_n, _, eps_n, centred_n = norm_affine(find(blocks[layer], anatomy.attn_norm)._module, spec.norm_plus_one)
            if centred_n:
                raise ValueError("a centring norm after the attention is not one the components readout knows")
            u_layer = (u if g_n is None else g_n * u) / attribution.rms_scale(r["attn_raw"], eps_n)
        o_proj = find(blocks[layer], anatomy.o_proj)._module
        z = own_heads(site, o_proj, r["z"])
        split = attribution.split_heads(z, z.shape[-1] // spec.head_dim)
        vectors = site.project(o_proj, split) if site.project is not None else split @ weight_o(o_proj).T
        heads.append(vectors.float() @ u_layer)
        bias = getattr(o_proj, "bias", None)
        attn_bias.append(bias.float() @ u_layer if bias is not None else torch.zeros((), device=u.device))
    first_block = reads[0]
    return {
        "logit": logit, "sigma": sigma,
        "embed": (first_block["stream"].float() - first_block["attn"] - first_block["mlp"]) @ u,
        "attn": torch.stack([r["attn"] @ u for r in reads]), "mlp": torch.stack([r["mlp"] @ u for r in reads]),
        "heads": gathered(site, torch.stack(heads), 1), "attn_bias": torch.stack(attn_bias),
        "bias": beta @ w if beta is not None else torch.zeros((), device=u.device),
    }


def own_heads(site, o_proj, z: torch.Tensor) -> torch.Tensor:
    """This rank's heads' slice of the output projection's input. nnsight hands a row-parallel layer's input
    whole (every rank's heads, gathered), while the layer's weight on this rank covers its own run of heads."""
    width = getattr(o_proj, "input_size_per_partition", z.shape[-1])
    if z.shape[-1] == width:
        return z
    if z.shape[-1] % width:
        raise ValueError(f"the output projection's input {tuple(z.shape)} does not split into runs of {width}")
    rank = site.rank()
    return z[rank * width:(rank + 1) * width]


def unembedding_rows(model, site, ids: list[int]) -> torch.Tensor:
    """The unembedding's rows for `ids` [len(ids), d_model], whole on every rank (`Site.rows`)."""
    head = find(model, site.layout.head)._module
    index = torch.tensor(ids, dtype=torch.long, device=head.weight.device)
    if site.rows is not None:
        return site.rows(head, index)
    if getattr(head, "bias", None) is not None:
        raise ValueError("an unembedding with a bias is not one the components readout knows")
    return head.weight[index]


def gathered(site, x: torch.Tensor, dim: int) -> torch.Tensor:
    """x with this rank's heads along `dim` -> every head's (tensor parallelism)."""
    return site.gather_heads(x, dim) if site.gather_heads is not None else x

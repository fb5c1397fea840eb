"""An independent reference for the components readout: plain transformers in float32, forward hooks, and
the attention weights of `output_attentions` on the eager implementation (test_components*.py).

Nothing here imports lensapp: the paths to each family's parts are written out again, and every part is
read through the frozen final norm the naive way, one vector at a time (norm(c) = g * P c / sigma(h), then
dot with W_U[target] - W_U[foil]), rather than through the one direction the app folds it into.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Parts:
    """Where a family's parts live in transformers' tree."""

    blocks: str
    norm: str
    attn: str
    o_proj: str
    mlp: str
    attn_norm: str = ""
    mlp_norm: str = ""
    plus_one: bool = False              # Gemma's norms multiply by (1 + weight)


LLAMA = Parts("model.layers", "model.norm", "self_attn", "self_attn.o_proj", "mlp")
PARTS = {
    "llama": LLAMA, "mistral": LLAMA, "qwen2": LLAMA, "qwen3": LLAMA,
    "gemma2": Parts("model.layers", "model.norm", "self_attn", "self_attn.o_proj", "mlp",
                    "post_attention_layernorm", "post_feedforward_layernorm", plus_one=True),
    "gpt2": Parts("transformer.h", "transformer.ln_f", "attn", "attn.c_proj", "mlp"),
    "gpt_neox": Parts("gpt_neox.layers", "gpt_neox.final_layer_norm", "attention", "attention.dense", "mlp"),
}


def get(module, path: str):
    for name in path.split("."):
        module = getattr(module, name)
    return module


def out0(output):
    return output[0] if isinstance(output, tuple) else output


def load_eager(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()


def frozen(norm, plus_one: bool, h: torch.Tensor):
    """The norm `norm` as a linear map with its scale frozen at h [d]: c -> g * P c / sigma(h)."""
    centred = isinstance(norm, torch.nn.LayerNorm)
    eps = norm.eps if hasattr(norm, "eps") else norm.variance_epsilon
    g = norm.weight.detach() + 1 if plus_one else norm.weight.detach()
    x = h - h.mean() if centred else h
    sigma = torch.sqrt((x * x).mean() + eps)
    return lambda c: g * ((c - c.mean()) if centred else c) / sigma


def head_vectors(o_proj, z: torch.Tensor, head_dim: int) -> list[torch.Tensor]:
    """Each head's slice of the output projection applied to its own output, [d_model] each."""
    W = o_proj.weight.detach()
    W = W if type(o_proj).__name__ != "Conv1D" else W.T          # Conv1D: y = x @ W (W [in, out])
    return [W[:, h * head_dim:(h + 1) * head_dim] @ z[h * head_dim:(h + 1) * head_dim]
            for h in range(z.shape[0] // head_dim)]


def reference(hf, ids: list[int], position: int, target: int, foil: int | None = None,
              patterns_layer: int | None = None) -> dict:
    """The components of hf's logit of `target` (minus `foil`) at `position`, as the CLI's JSON lays them out:
    logit, embed, attn [L], mlp [L], heads [L][H], attn_bias [L], bias; and top attended positions' weights
    rows [L][H][P + 1], pattern [H][P + 1][P + 1] at `patterns_layer`."""
    parts = PARTS[hf.config.model_type]
    blocks = get(hf, parts.blocks)
    seen: dict = {}
    hooks = [get(hf, parts.norm).register_forward_pre_hook(lambda m, a: seen.__setitem__("final", a[0][0]))]
    for layer, block in enumerate(blocks):
        def keep(name, layer=layer):
            return lambda m, a, o: seen.__setitem__((name, layer), out0(o)[0])
        hooks.append(get(block, parts.o_proj).register_forward_pre_hook(
            lambda m, a, layer=layer: seen.__setitem__(("z", layer), a[0][0])))
        hooks.append(get(block, parts.attn).register_forward_hook(keep("attn_raw")))
        hooks.append(get(block, parts.attn_norm or parts.attn).register_forward_hook(keep("attn")))
        hooks.append(get(block, parts.mlp_norm or parts.mlp).register_forward_hook(keep("mlp")))
    try:
        with torch.no_grad():
            out = hf(torch.tensor([ids]), output_hidden_states=True, output_attentions=True)
    finally:
        for hook in hooks:
            hook.remove()
    with torch.no_grad():
        return _parts(hf, parts, blocks, seen, out, position, target, foil, patterns_layer)


def _parts(hf, parts: Parts, blocks, seen: dict, out, p: int, target: int, foil: int | None,
           patterns_layer: int | None) -> dict:
    W_U = hf.get_output_embeddings().weight.detach()
    w = W_U[target] - (W_U[foil] if foil is not None else 0)
    final_norm = get(hf, parts.norm)
    h = seen["final"][p]
    F = frozen(final_norm, parts.plus_one, h)
    bias = getattr(final_norm, "bias", None)
    head_dim = hf.config.hidden_size // hf.config.num_attention_heads
    head_dim = getattr(hf.config, "head_dim", None) or head_dim
    result = {"logit": float(final_norm(h) @ w), "embed": float(F(out.hidden_states[0][0, p]) @ w),
              "bias": float(bias.detach() @ w) if bias is not None else 0.0,
              "attn": [], "mlp": [], "heads": [], "attn_bias": [], "rows": []}
    for layer, block in enumerate(blocks):
        result["attn"].append(float(F(seen[("attn", layer)][p]) @ w))
        result["mlp"].append(float(F(seen[("mlp", layer)][p]) @ w))
        post = (frozen(get(block, parts.attn_norm), parts.plus_one, seen[("attn_raw", layer)][p])
                if parts.attn_norm else (lambda c: c))
        o_proj = get(block, parts.o_proj)
        vectors = head_vectors(o_proj, seen[("z", layer)][p], head_dim)
        result["heads"].append([float(F(post(v)) @ w) for v in vectors])
        b = getattr(o_proj, "bias", None)
        result["attn_bias"].append(float(F(post(b.detach())) @ w) if b is not None else 0.0)
        result["rows"].append(out.attentions[layer][0, :, p, :p + 1].numpy())
    if patterns_layer is not None:
        result["pattern"] = out.attentions[patterns_layer][0, :, :p + 1, :p + 1].numpy()
    return result


def between_logits(hf, ids: list[int]) -> list[torch.Tensor]:
    """Per layer, the head's logits [P, vocab] (before the family's soft-capping or scale) at the residual between
    its attention and its MLP: h_l + attn_l, with hidden_states[l] the stream entering block l."""
    parts = PARTS[hf.config.model_type]
    blocks, seen = get(hf, parts.blocks), {}
    hooks = [get(block, parts.attn_norm or parts.attn).register_forward_hook(
        lambda m, a, o, layer=layer: seen.__setitem__(layer, out0(o)[0])) for layer, block in enumerate(blocks)]
    try:
        with torch.no_grad():
            out = hf(torch.tensor([ids]), output_hidden_states=True)
            norm, head = get(hf, parts.norm), hf.get_output_embeddings()
            return [head(norm(out.hidden_states[layer][0] + seen[layer])) for layer in range(len(blocks))]
    finally:
        for hook in hooks:
            hook.remove()


def assert_parts_match(got: dict, want: dict, what: str, rtol: float = 1e-4) -> float:
    """Each part within rtol of the largest part (a part near zero is judged against the logit's scale, not
    its own); the heads and the layers alike. Returns the largest error found, relative to that scale."""
    scale = max(abs(want["embed"]), np.abs(want["attn"]).max(), np.abs(want["mlp"]).max(),
                np.abs(want["heads"]).max(), abs(want["logit"]))
    worst = 0.0
    for key in ("logit", "embed", "bias", "attn", "mlp", "heads", "attn_bias"):
        error = float(np.abs(np.asarray(got[key], dtype=np.float64) - np.asarray(want[key], dtype=np.float64)).max())
        worst = max(worst, error / scale)
        assert error <= rtol * scale, f"{what}: {key} differs by {error:.3g} (scale {scale:.3g})"
    return worst

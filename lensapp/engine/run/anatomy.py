"""Inside a block: where each family keeps its attention, its output projection, its MLP and the norms
around them, per backend; what the components readout (`components.py`) reads.

A block adds two parts to the residual stream: its attention's output and its MLP's output (GPT-NeoX adds
both to the same input, in parallel; every other family here adds them in turn). Where each part is read,
relative to a block:

- `attn`: the attention module; its output (first item on transformers, which also returns weights) is
  what it adds, unless `attn_norm` names a norm between it and the stream (Gemma 2's post-attention
  norm), whose output is then the part.
- `o_proj`: the attention's output projection; its input is every head's output side by side
  (`n_heads * head_dim`, this rank's heads under tensor parallelism), its weight W_O maps them to d_model
  (GPT-2's transformers Conv1D stores it transposed).
- `kernel` (vLLM only): the attention kernel, which receives the rotated queries and keys; vLLM's
  kernels never form the weights, so the readout recomputes them from these. On transformers the
  weights come from the attention module's own eager path.
- `mlp`, `mlp_norm`: the MLP, and a norm after it (Gemma 2's post-feedforward norm).

What is read is what the model runs: a family that is not listed here is refused in one line
(`check`). Tested against plain transformers on a tiny random model of each listed model type, on both
backends (tests/test_components*.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Anatomy:
    """Dotted paths from a block to its parts (see the module docstring)."""

    attn: str
    o_proj: str
    mlp: str
    kernel: str = ""
    attn_norm: str = ""
    mlp_norm: str = ""

    @property
    def attn_part(self) -> str:
        """The module whose output is what the attention adds to the stream."""
        return self.attn_norm or self.attn

    @property
    def mlp_part(self) -> str:
        """The module whose output is what the MLP adds to the stream."""
        return self.mlp_norm or self.mlp


LLAMA = Anatomy("self_attn", "self_attn.o_proj", "mlp", kernel="self_attn.attn")
GEMMA2 = Anatomy("self_attn", "self_attn.o_proj", "mlp", kernel="self_attn.attn",
                 attn_norm="post_attention_layernorm", mlp_norm="post_feedforward_layernorm")
GPT2 = Anatomy("attn", "attn.c_proj", "mlp", kernel="attn.attn")
GPT_NEOX = Anatomy("attention", "attention.dense", "mlp", kernel="attention.attn")     # vLLM: HF's tree

# By model type: what has been checked against the reference, and nothing else.
ANATOMIES = {"llama": LLAMA, "mistral": LLAMA, "qwen2": LLAMA, "qwen3": LLAMA, "gemma2": GEMMA2, "gpt2": GPT2,
             "gpt_neox": GPT_NEOX}


def supported() -> str:
    return ", ".join(sorted(ANATOMIES))


def refusal(model_type: str, pipeline_stages: int = 1) -> str | None:
    """Why components cannot be read on this model here (one line), or None when they can."""
    if model_type not in ANATOMIES:
        return (f"attention and MLP contributions are not read for {model_type} models here (the model types "
                f"whose blocks have been checked are: {supported()})")
    if pipeline_stages > 1:
        return ("attention and MLP contributions are not read under pipeline parallelism (each stage holds "
                "its own blocks); serve with tensor parallelism or on one worker")
    return None


def anatomy_of(model_type: str) -> Anatomy | None:
    """The anatomy of a model type (the same paths on both backends), or None where it is not supported."""
    return ANATOMIES.get(model_type)


def weight_o(module) -> torch.Tensor:
    """An output projection's weight as [d_model, n_heads * head_dim] (torch Linear's layout; a transformers
    Conv1D stores it [in, out])."""
    weight = module.weight
    return weight.T if type(module).__name__ == "Conv1D" else weight


def norm_affine(module, plus_one: bool) -> tuple[torch.Tensor | None, torch.Tensor | None, float, bool]:
    """A norm module -> (its multiplier g or None, its bias or None, eps, whether it centres): RMSNorm
    (vLLM's, transformers' per family) or LayerNorm (torch's, vLLM's). `plus_one`: the family's norms
    multiply by (1 + weight) (Gemma)."""
    name = type(module).__name__
    eps = getattr(module, "variance_epsilon", None)
    if eps is None:
        eps = getattr(module, "eps", None)
    if eps is None:
        raise ValueError(f"{name}: no eps found; this norm is not one the components readout knows")
    weight = getattr(module, "weight", None)
    if weight is not None:
        weight = weight.float() + 1.0 if plus_one else weight.float()
    bias = getattr(module, "bias", None)
    centred = "rms" not in name.lower()
    return weight, None if bias is None else bias.float(), float(eps), centred

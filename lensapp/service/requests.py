"""What a caller may ask: one dataclass per request kind, its fields (`fields.py`) in their published order.

A request is validated when it is made, once: `LensRequest.parse(prompts=..., k="5", ...)` reads raw values
(from a link, the API, the command line or a form), and `LensRequest(prompts=(...), k=5)` values given in
code, each through its field's one parser; either raises `RequestError` with one line. It is immutable
after, and nothing downstream reads it again. What needs the model (layers against its depth, token
limits, the work budget) is checked when the service plans it (`planning.py`, `cost.py`).

The order of a class's fields is what every surface shows (the API's parameters, the CLI's arguments,
a link's keys, a tab's inputs): a field is only ever added at the end.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import greedy
from .field import RequestError, fields_of
from .fields import (
    ABLATION,
    ALPHAS,
    CHAT,
    CHAT_K,
    CHAT_LAYER,
    CHAT_LENS,
    CHAT_MAX_TOKENS,
    DESCRIBE_LAYER,
    DESCRIBE_POSITION,
    DESCRIBE_TOKENS,
    DIRECTION,
    EVAL_ITEMS,
    EVAL_SPLIT,
    FOIL,
    FORCE,
    FROM_WORD,
    INSPECT,
    INSPECT_LAYER,
    INTERVENE_SEED,
    KIND,
    LAYERS,
    LENS,
    MAX_TOKENS,
    MESSAGES,
    NEW_TOKENS,
    OBJECTIVE,
    PATTERNS,
    POSITION,
    POSITIONS,
    PROMPT,
    PROMPT_ONLY,
    PROMPTS,
    RAW,
    REFERENCE,
    SEED,
    SKIP_PUNCTUATION,
    SOURCE,
    SOURCE_POSITIONS,
    SPAN,
    SUBLAYERS,
    TARGET,
    TARGETS,
    TEMPERATURE,
    WORD,
    K,
)
from .selection import Selection


class Request:
    """What every request kind shares: each value read by its field's parser when the request is made."""

    def __post_init__(self):
        for name, field in fields_of(type(self)).items():      # None: not given (the default, or "no X given")
            object.__setattr__(self, name, field(getattr(self, name)))

    @classmethod
    def parse(cls, **raw):
        """The request from raw values (None or missing: the field's default)."""
        unknown = set(raw) - set(fields_of(cls))
        if unknown:
            raise TypeError(f"{cls.__name__} has no field {sorted(unknown)}")
        return cls(**{name: raw.get(name) for name in fields_of(cls)})

    def to_raw(self) -> dict:
        """The request as JSON values that `parse` reads back into an equal request: what a page keeps so that
        it can have its result made again (ui/kept.py)."""
        return {name: _raw(getattr(self, name)) for name in fields_of(type(self))}


def _raw(value):
    """A parsed value as JSON: tuples as lists, a Selection as its text, dicts by value."""
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (tuple, list)):
        return [_raw(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _raw(v) for k, v in value.items()}
    return value


class Sampled:
    """What a request that generates with a temperature has."""

    @property
    def sampled(self) -> bool:
        """Sampling rather than greedy decoding (`config.greedy`: at or above vLLM's own greedy threshold)."""
        return not greedy(self.temperature)


@dataclass(frozen=True)
class LensRequest(Request):
    prompts: tuple[str, ...] = PROMPTS.declared()
    lens: str = LENS.declared()
    layers: Selection = LAYERS.declared()
    k: int = K.declared()
    targets: tuple[str, ...] = TARGETS.declared()
    chat: bool = CHAT.declared()
    raw: bool = RAW.declared()
    skip_punctuation: bool = SKIP_PUNCTUATION.declared()
    sublayers: bool = SUBLAYERS.declared()


@dataclass(frozen=True)
class GenerateRequest(Sampled, Request):
    prompt: str = PROMPT.declared()
    max_tokens: int = MAX_TOKENS.declared()
    lens: str = LENS.declared()
    layers: Selection = LAYERS.declared()
    k: int = K.declared()
    temperature: float = TEMPERATURE.declared()
    seed: int | None = SEED.declared()
    chat: bool = CHAT.declared()
    raw: bool = RAW.declared()
    force: tuple = FORCE.declared()


@dataclass(frozen=True)
class ChatRequest(Sampled, Request):
    """layer: the readout's layer (negative counts from the end; None: about two thirds of the depth)."""

    messages: tuple[dict, ...] = MESSAGES.declared()
    lens: str = CHAT_LENS.declared()
    layer: int | None = CHAT_LAYER.declared()
    max_tokens: int = CHAT_MAX_TOKENS.declared()
    temperature: float = TEMPERATURE.declared()
    k: int = CHAT_K.declared()
    seed: int | None = SEED.declared()
    force: tuple = FORCE.declared()


@dataclass(frozen=True)
class InterveneRequest(Request):
    """Steer, ablate or patch the residual stream at `layer` (a layer or a span), then read every lens again
    (service/intervening/ says what each field does)."""

    prompt: str = PROMPT.declared()
    intervention: str = KIND.declared()
    word: str = WORD.declared()
    layer: Selection = SPAN.declared()
    alphas: tuple[float, ...] = ALPHAS.declared()
    direction: str = DIRECTION.declared()
    from_word: str = FROM_WORD.declared()
    objective: str = OBJECTIVE.declared()
    positions: Selection = POSITIONS.declared()
    prompt_only: bool = PROMPT_ONLY.declared()
    ablation: str = ABLATION.declared()
    reference: str = REFERENCE.declared()
    source: str = SOURCE.declared()
    source_positions: Selection | str = SOURCE_POSITIONS.declared()
    lens: str = LENS.declared()
    layers: Selection = LAYERS.declared()
    k: int = K.declared()
    targets: tuple[str, ...] = TARGETS.declared()
    new_tokens: int = NEW_TOKENS.declared()
    temperature: float = TEMPERATURE.declared()
    seed: int | None = INTERVENE_SEED.declared()
    chat: bool = CHAT.declared()
    raw: bool = RAW.declared()


@dataclass(frozen=True)
class ComponentsRequest(Request):
    """Who wrote `target`'s logit (minus `foil`'s) at `position`: the embedding, each layer's attention (and each
    head) and MLP, read through the frozen final norm; with `patterns`, that layer's attention weights
    (service/components.py)."""

    prompt: str = PROMPT.declared()
    target: str = TARGET.declared()
    foil: str = FOIL.declared()
    position: int = POSITION.declared()
    patterns: int | None = PATTERNS.declared()
    chat: bool = CHAT.declared()


@dataclass(frozen=True)
class DescribeRequest(Request):
    """Describe block `layer`'s output at `position` in words (Patchscopes): the state replaces block
    `inspect_layer`'s output at the inspection prompt's last token, in its first forward only, and the model
    goes on greedily (service/describing.py)."""

    prompt: str = PROMPT.declared()
    layer: Selection = DESCRIBE_LAYER.declared()
    position: int = DESCRIBE_POSITION.declared()
    max_tokens: int = DESCRIBE_TOKENS.declared()
    inspect: str = INSPECT.declared()
    inspect_layer: int | None = INSPECT_LAYER.declared()
    chat: bool = CHAT.declared()


@dataclass(frozen=True)
class EvaluateRequest(Request):
    """How good each loaded lens is: on every item of `items` (a shipped set, or a file on the command line) of
    one `split`, the rank of the unspoken intermediate at every layer, at the prompt's last position
    (service/evaluating.py)."""

    items: str = EVAL_ITEMS.declared()
    split: str = EVAL_SPLIT.declared()


__all__ = ["ChatRequest", "ComponentsRequest", "DescribeRequest", "EvaluateRequest", "GenerateRequest",
           "InterveneRequest", "LensRequest", "Request",
           "RequestError"]

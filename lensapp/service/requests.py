"""What a caller may ask: one dataclass per request kind, each field declared once in `fields.py`.

`LensRequest.parse(prompts=..., k="5", ...)` reads raw values (from a link, the API, the command line
or a form) with each field's parser; `req.checked()` re-reads a request built in code the same way. Both
raise `RequestError` with one line. What needs the model (layers, token limits, the work budget) is
checked when the service plans the request (`planning.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from ..engine.protocol import GREEDY_BELOW
from .fields import (
    ABLATION,
    ALPHAS,
    CHAT,
    CHAT_K,
    CHAT_LAYER,
    CHAT_LENS,
    CHAT_MAX_TOKENS,
    DIRECTION,
    FROM_WORD,
    KIND,
    LAYERS,
    LENS,
    MAX_TOKENS,
    MESSAGES,
    NEW_TOKENS,
    OBJECTIVE,
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
    TARGETS,
    TEMPERATURE,
    WORD,
    K,
    RequestError,
    fields_of,
)


class _Parsed:
    """What every request kind shares: reading raw values through its fields' parsers."""

    @classmethod
    def parse(cls, **raw):
        unknown = set(raw) - set(fields_of(cls))
        if unknown:
            raise TypeError(f"{cls.__name__} has no field {sorted(unknown)}")
        return cls(**{name: field(raw.get(name)) for name, field in fields_of(cls).items()})

    def checked(self):
        """This request with every value read by its field's parser (RequestError if one cannot be)."""
        return type(self).parse(**{f.name: getattr(self, f.name) for f in fields(self)})


@dataclass(frozen=True)
class LensRequest(_Parsed):
    prompts: tuple[str, ...] = PROMPTS.declared()
    lens: str = LENS.declared()
    layers: str = LAYERS.declared()
    k: int = K.declared()
    targets: tuple[str, ...] = TARGETS.declared()
    raw: bool = RAW.declared()
    chat: bool = CHAT.declared()
    skip_punctuation: bool = SKIP_PUNCTUATION.declared()


@dataclass(frozen=True)
class GenerateRequest(_Parsed):
    prompt: str = PROMPT.declared()
    max_tokens: int = MAX_TOKENS.declared()
    lens: str = LENS.declared()
    layers: str = LAYERS.declared()
    k: int = K.declared()
    temperature: float = TEMPERATURE.declared()
    seed: int | None = SEED.declared()
    chat: bool = CHAT.declared()
    raw: bool = RAW.declared()

    @property
    def sampled(self) -> bool:
        """Sampling rather than greedy decoding (at or above vLLM's own greedy threshold)."""
        return self.temperature >= GREEDY_BELOW


@dataclass(frozen=True)
class ChatRequest(_Parsed):
    """layer: the readout's layer (negative counts from the end; None: about two thirds of the depth)."""

    messages: tuple[dict, ...] = MESSAGES.declared()
    lens: str = CHAT_LENS.declared()
    layer: int | None = CHAT_LAYER.declared()
    max_tokens: int = CHAT_MAX_TOKENS.declared()
    temperature: float = TEMPERATURE.declared()
    k: int = CHAT_K.declared()
    seed: int | None = SEED.declared()


@dataclass(frozen=True)
class InterveneRequest(_Parsed):
    """Steer, ablate or patch the residual stream at `layer` (a layer or a span), then read every lens again
    (service/intervening.py says what each field does)."""

    prompt: str = PROMPT.declared()
    intervention: str = KIND.declared()
    word: str = WORD.declared()
    layer: str = SPAN.declared()
    alphas: tuple[float, ...] = ALPHAS.declared()
    direction: str = DIRECTION.declared()
    from_word: str = FROM_WORD.declared()
    objective: str = OBJECTIVE.declared()
    positions: str = POSITIONS.declared()
    prompt_only: bool = PROMPT_ONLY.declared()
    ablation: str = ABLATION.declared()
    reference: str = REFERENCE.declared()
    source: str = SOURCE.declared()
    source_positions: str = SOURCE_POSITIONS.declared()
    lens: str = LENS.declared()
    layers: str = LAYERS.declared()
    k: int = K.declared()
    targets: tuple[str, ...] = TARGETS.declared()
    new_tokens: int = NEW_TOKENS.declared()
    temperature: float = TEMPERATURE.declared()
    seed: int | None = SEED.declared()
    chat: bool = CHAT.declared()
    raw: bool = RAW.declared()


__all__ = ["ChatRequest", "GenerateRequest", "InterveneRequest", "LensRequest", "RequestError"]

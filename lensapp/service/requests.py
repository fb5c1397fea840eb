"""What a caller may ask, and every check on it: one place for the CLI, the API, the tabs and links.

`LensRequest` / `GenerateRequest` / `ChatRequest` are built from user input; `validate_*` turn bad
input into a `RequestError` with a one-line message. The `as_*` coercions read numbers typed as
text (a form field, an API argument, a link) with the same messages everywhere. Nothing here
needs a model: `parse_layers` takes the model's layer count.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ..config import (
    LENS_CHOICES,
    MAX_CHAT_MESSAGES,
    MAX_COMPARE_PROMPTS,
    MAX_GENERATE_TOKENS,
    MAX_K,
    MAX_LAYERS_CHARS,
    MAX_PROMPT_CHARS,
    MAX_SEED,
    MAX_TARGET_CHARS,
    MAX_TARGETS,
    MAX_TEMPERATURE,
)

_RANGE = re.compile(r"(-?\d+)-(-?\d+)")
CHAT_ROLES = ("system", "user", "assistant")


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


@dataclass(frozen=True)
class ChatRequest:
    """messages: ({"role": ..., "content": ...}, ...), ending with the user's. layer None: the default."""

    messages: tuple[dict, ...]
    lens: str = "jacobian"
    layer: int | None = None
    max_tokens: int = 32
    temperature: float = 0.0
    k: int = 3
    seed: int | None = None


def parse_layers(text: str, n_layers: int, allowed: list[int] | None = None) -> list[int]:
    """'all' | 'last' | '3' | '0,5,-1' | '10-20' -> sorted unique layer indices (or RequestError)."""
    if not isinstance(text, str):
        raise RequestError(f"layers must be text like 'all', '0,5,-1' or '10-20'; got {type(text).__name__}")
    if len(text) > MAX_LAYERS_CHARS:
        raise RequestError(f"the layer selection has {len(text)} characters; the limit is {MAX_LAYERS_CHARS}")
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
            raise RequestError(f"layers must be 'all', numbers like 0,5,-1 or a range like 10-20; "
                               f"got {_short(text)!r}") from None
    if not layers:
        raise RequestError("no layers selected")
    outside = sorted(set(layers) - set(pool))
    if outside:
        what = f"0..{n_layers - 1}" if allowed is None else f"the Jacobian lens's layers {span(pool)}"
        raise RequestError(f"layers {span(outside)} are not in {what}")
    return sorted(layers)


def _layer_index(i: int, n_layers: int) -> int:
    j = i + n_layers if i < 0 else i
    if not 0 <= j < n_layers:
        raise RequestError(f"layer {i} is outside this {n_layers}-layer model (0..{n_layers - 1})")
    return j


def span(layers: list[int]) -> str:
    """[3, 4, 5, 6] -> '3..6'; anything else as a comma list."""
    if len(layers) > 2 and layers == list(range(layers[0], layers[-1] + 1)):
        return f"{layers[0]}..{layers[-1]}"
    return ", ".join(map(str, layers))


# -- validation --------------------------------------------------------------------------------------

def validate_lens(req: LensRequest, max_prompts: int = MAX_COMPARE_PROMPTS) -> None:
    _check_lens(req.lens)
    _check_k(req.k)
    _check_flags(raw=req.raw, chat=req.chat)
    if not req.prompts:
        raise RequestError("no prompt given")
    if len(req.prompts) > max_prompts:
        raise RequestError(f"at most {max_prompts} prompts at once; got {len(req.prompts)}")
    for p in req.prompts:
        check_prompt(p)
    if len(req.targets) > MAX_TARGETS:
        raise RequestError(f"at most {MAX_TARGETS} targets; got {len(req.targets)}")
    for t in req.targets:
        if not isinstance(t, str) or not t.strip():
            raise RequestError("a target is empty")
        if len(t) > MAX_TARGET_CHARS:
            raise RequestError(f"a target has {len(t)} characters; the limit is {MAX_TARGET_CHARS}")
        _check_text(t, "a target")


def validate_generate(req: GenerateRequest) -> None:
    _check_lens(req.lens)
    _check_k(req.k)
    _check_flags(raw=req.raw, chat=req.chat)
    check_prompt(req.prompt)
    _check_sampling(req.max_tokens, req.temperature, req.seed)


def validate_chat(req: ChatRequest) -> None:
    if not isinstance(req.lens, str) or req.lens not in ("logit", "jacobian"):
        raise RequestError(f"the chat readout is one lens, logit or jacobian; got {show(req.lens)}")
    _check_k(req.k)
    _check_sampling(req.max_tokens, req.temperature, req.seed)
    if req.layer is not None and (isinstance(req.layer, bool) or not isinstance(req.layer, int)):
        raise RequestError(f"the chat layer must be a whole number; got {show(req.layer)}")
    msgs = req.messages
    if not isinstance(msgs, (list, tuple)) or not msgs:
        raise RequestError("the conversation is empty")
    if len(msgs) > MAX_CHAT_MESSAGES:
        raise RequestError(f"at most {MAX_CHAT_MESSAGES} messages; got {len(msgs)}")
    for m in msgs:
        if not isinstance(m, dict) or m.get("role") not in CHAT_ROLES or not isinstance(m.get("content"), str):
            raise RequestError("each message must be {'role': 'system' | 'user' | 'assistant', 'content': text}")
        if len(m["content"]) > MAX_PROMPT_CHARS:
            raise RequestError(f"a message has {len(m['content'])} characters; the limit is {MAX_PROMPT_CHARS}")
        _check_text(m["content"], "a message")
    if msgs[-1]["role"] != "user" or not msgs[-1]["content"].strip():
        raise RequestError("the conversation must end with a user message that is not empty")


def check_prompt(p) -> None:
    if not isinstance(p, str) or not p.strip():
        raise RequestError("the prompt is empty")
    if len(p) > MAX_PROMPT_CHARS:
        raise RequestError(f"the prompt has {len(p)} characters; the limit is {MAX_PROMPT_CHARS}")
    _check_text(p, "the prompt")


def _check_text(text: str, what: str) -> None:
    # A lone surrogate cannot be encoded as UTF-8, so no tokenizer can take it.
    if any(0xD800 <= ord(ch) <= 0xDFFF for ch in text):
        raise RequestError(f"{what} holds a lone surrogate, which is not text")


def _check_lens(lens) -> None:
    if not isinstance(lens, str) or lens not in LENS_CHOICES:
        raise RequestError(f"lens must be logit, jacobian or both; got {show(lens)}")


def _check_flags(**flags) -> None:
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise RequestError(f"{name} must be true or false; got {show(value)}")


def _check_k(k) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise RequestError(f"k must be a whole number in 1..{MAX_K}; got {show(k)}")


def _check_sampling(max_tokens, temperature, seed) -> None:
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 1 <= max_tokens <= MAX_GENERATE_TOKENS:
        raise RequestError(f"max_tokens must be a whole number in 1..{MAX_GENERATE_TOKENS}; "
                           f"got {show(max_tokens)}")
    # NaN fails the comparison; a huge int is compared exactly (math.isfinite would overflow converting it)
    if (isinstance(temperature, bool) or not isinstance(temperature, (int, float))
            or not 0 <= temperature <= MAX_TEMPERATURE):
        raise RequestError(f"temperature must be a number in 0..{MAX_TEMPERATURE:g}; got {show(temperature)}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED):
        raise RequestError(f"seed must be a whole number in 0..{MAX_SEED}; got {show(seed)}")


# -- coercion of typed values (form fields, API arguments) ------------------------------------------

def as_int(value, what: str) -> int:
    """A whole number from an int, a whole float or text ('7', '7.0'); RequestError otherwise.
    An int, or text of one, is read exactly (a float would round 2**53 + 1)."""
    if isinstance(value, bool):
        raise RequestError(f"{what} must be a whole number; got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:          # '7.0', '1e3', or more digits than Python converts
            pass
    try:
        f = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError, OverflowError):
        raise RequestError(f"{what} must be a whole number; got {show(value)}") from None
    if not math.isfinite(f) or not f.is_integer():
        raise RequestError(f"{what} must be a whole number; got {show(value)}")
    return int(f)


def as_float(value, what: str) -> float:
    """A finite number from a number or text; RequestError otherwise (NaN and infinities included)."""
    if isinstance(value, bool):
        raise RequestError(f"{what} must be a number; got {value!r}")
    try:
        f = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError, OverflowError):
        raise RequestError(f"{what} must be a number; got {show(value)}") from None
    if not math.isfinite(f):
        raise RequestError(f"{what} must be a finite number; got {show(value)}")
    return f


def as_seed(value) -> int | None:
    """An optional seed: empty / None means none."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    return as_int(value, "seed")


def as_flag(value, what: str) -> bool:
    """A yes/no from a bool, 0/1 or text ('true', 'false', '1', '0', '')."""
    if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0", ""):
        return value.strip().lower() in ("true", "1")
    raise RequestError(f"{what} must be true or false; got {_short(repr(value))}")


def as_text(value, what: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise RequestError(f"{what} must be text; got {type(value).__name__}")
    return value


def split_targets(text: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in (text or "").split(",") if t.strip())


def show(value, n: int = 40) -> str:
    """A value as a message quotes it: its repr, clipped to `n` characters; an integer too long to print
    (Python refuses past 4300 digits) by its size."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 3 * n:
        return f"a number of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    try:
        return _short(repr(value), n)
    except Exception:  # noqa: BLE001 - a value that cannot describe itself is named by its type
        return f"a {type(value).__name__}"


def _short(text: str, n: int = 40) -> str:
    return text if len(text) <= n else text[:n] + "…"

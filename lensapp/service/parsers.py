"""The parsers a field may read its value with: small combinators, each a function from what a surface hands
over (text from a link or the command line, a JSON value from the API, a form's value) to the value, or
`RequestError` with one line naming the field. The fields themselves are in `fields.py`.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from ..config import MAX_CHAT_SENT, MAX_LAYERS_CHARS, MAX_PROMPT_CHARS, MAX_TARGET_CHARS, MAX_TARGETS
from .field import RequestError, show
from .selection import Selection

TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


def whole(name: str, lo: int, hi: int) -> Callable[[Any], int]:
    """A whole number in lo..hi, from an int, a whole float or text ('7', '7.0'); an int, or text of one,
    is read exactly (a float would round 2**53 + 1)."""
    def parse(raw) -> int:
        value = _whole(raw, name)
        if not lo <= value <= hi:
            raise RequestError(f"{name} must be a whole number in {lo}..{hi}; got {show(value)}")
        return value
    return parse


def _whole(raw, name: str) -> int:
    if isinstance(raw, bool):
        raise RequestError(f"{name} must be a whole number; got {raw!r}")
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str):
        try:
            return int(raw)
        except ValueError:          # '7.0', '1e3', or more digits than Python converts
            pass
    try:
        f = float(raw.strip() if isinstance(raw, str) else raw)
    except (TypeError, ValueError, OverflowError):
        raise RequestError(f"{name} must be a whole number; got {show(raw)}") from None
    if not math.isfinite(f) or not f.is_integer():
        raise RequestError(f"{name} must be a whole number; got {show(raw)}")
    return int(f)


def optional_whole(name: str, lo: int, hi: int) -> Callable[[Any], int | None]:
    """`whole`, or None for an empty value ('' or blank text)."""
    inner = whole(name, lo, hi)

    def parse(raw) -> int | None:
        return None if isinstance(raw, str) and not raw.strip() else inner(raw)
    return parse


def number(name: str, lo: float, hi: float) -> Callable[[Any], float]:
    """A finite number in lo..hi, from a number or text (NaN and infinities refused)."""
    def parse(raw) -> float:
        if isinstance(raw, bool):
            raise RequestError(f"{name} must be a number in {lo:g}..{hi:g}; got {raw!r}")
        try:
            f = float(raw.strip() if isinstance(raw, str) else raw)
        except (TypeError, ValueError, OverflowError):
            raise RequestError(f"{name} must be a number in {lo:g}..{hi:g}; got {show(raw)}") from None
        if not lo <= f <= hi:          # NaN fails the comparison too
            raise RequestError(f"{name} must be a number in {lo:g}..{hi:g}; got {show(raw)}")
        return f
    return parse


def flag(name: str) -> Callable[[Any], bool]:
    """Yes or no: a bool, 0 or 1, or text (1/true/yes/on, 0/false/no/off, empty)."""
    def parse(raw) -> bool:
        if isinstance(raw, bool) or (isinstance(raw, int) and raw in (0, 1)):
            return bool(raw)
        if isinstance(raw, str) and raw.strip().lower() in TRUE + FALSE:
            return raw.strip().lower() in TRUE
        raise RequestError(f"{name} must be true or false; got {show(raw)}")
    return parse


def choice(name: str, options: tuple[str, ...], say: str | None = None) -> Callable[[Any], str]:
    def parse(raw) -> str:
        if not isinstance(raw, str) or raw not in options:
            raise RequestError(f"{name} must be {say or ' or '.join(options)}; got {show(raw)}")
        return raw
    return parse


def text(what: str, max_chars: int, *, empty_ok: bool = False) -> Callable[[Any], str]:
    """Text of at most max_chars characters: no lone surrogates (no tokenizer can take one) and no control
    characters but tab, newline and carriage return."""
    def parse(raw) -> str:
        if not isinstance(raw, str):
            raise RequestError(f"{what} must be text; got {type(raw).__name__}")
        if not empty_ok and not raw.strip():
            raise RequestError(f"{what} is empty")
        if len(raw) > max_chars:
            raise RequestError(f"{what} has {len(raw)} characters; the limit is {max_chars}")
        check_text(raw, what)
        return raw
    return parse


def check_text(value: str, what: str) -> None:
    if any(0xD800 <= ord(ch) <= 0xDFFF for ch in value):
        raise RequestError(f"{what} holds a lone surrogate, which is not text")
    if any((ord(ch) < 0x20 and ch not in "\t\n\r") or ord(ch) == 0x7F for ch in value):
        raise RequestError(f"{what} holds control characters")


def layers(raw) -> Selection:
    """A layer selection: 'all', 'last', '3', '0,5,-1', '10-20' (resolved against a model in planning)."""
    if not isinstance(raw, str):
        raise RequestError(f"layers must be text like 'all', '0,5,-1' or '10-20'; got {type(raw).__name__}")
    if len(raw) > MAX_LAYERS_CHARS:
        raise RequestError(f"the layer selection has {len(raw)} characters; the limit is {MAX_LAYERS_CHARS}")
    try:
        return Selection(raw, MAX_LAYERS_CHARS)
    except RequestError:
        raise RequestError("layers must be 'all', numbers like 0,5,-1 or a range like 10-20; "
                           f"got {show(raw.strip() or 'all')}") from None


def targets(raw) -> tuple[str, ...]:
    """Target words: comma-separated text, or a list of them (a repeated flag); commas separate words
    wherever they come from, and blanks between them are dropped."""
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, (list, tuple)) or not all(isinstance(t, str) for t in items):
        raise RequestError(f"targets must be comma-separated words; got {show(raw)}")
    words = [t.strip() for item in items for t in item.split(",") if t.strip()]
    if len(words) > MAX_TARGETS:
        raise RequestError(f"at most {MAX_TARGETS} targets; got {len(words)}")
    return tuple(_target(t) for t in words)


_target = text("a target", MAX_TARGET_CHARS)


def prompts(raw) -> tuple[str, ...]:
    """One prompt, or a list of them (how many a request may hold is the service's to say)."""
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, (list, tuple)):
        raise RequestError("prompts must be a list of texts")
    if not items:
        raise RequestError("no prompt given")
    return tuple(_prompt(p) for p in items)


_prompt = text("the prompt", MAX_PROMPT_CHARS)


CHAT_ROLES = ("system", "user", "assistant")


def numbers(name: str, lo: float, hi: float, max_count: int, *, empty_ok: bool = False
            ) -> Callable[[Any], tuple[float, ...]]:
    """1..max_count numbers in lo..hi: comma-separated text, a list, or one number (empty_ok: none, too)."""
    one = number(name, lo, hi)

    def parse(raw) -> tuple[float, ...]:
        items = [raw] if not isinstance(raw, (list, tuple)) else raw
        if empty_ok and all(isinstance(t, str) and not t.strip() for t in items):
            return ()
        items = [t for item in items for t in (item.split(",") if isinstance(item, str) else [item])
                 if not isinstance(t, str) or t.strip()]
        if not items or len(items) > max_count:
            raise RequestError(f"{name} takes 1 to {max_count} values; got {len(items)}")
        return tuple(one(x) for x in items)
    return parse


def indices(name: str) -> Callable[[Any], Selection]:
    """Positions in a prompt (or a layer span), like layers: 'all', '3', '-1', '2-4' (resolved against the prompt
    or the model later)."""
    def parse(raw) -> Selection:
        if isinstance(raw, int) and not isinstance(raw, bool) and abs(raw) < 1 << 31:
            raw = str(raw)
        if isinstance(raw, str) and not raw.strip():
            raise RequestError(f"no {name} given: name one like 20, -1 or a span like 18-22")
        try:
            return layers(raw)
        except RequestError:
            raise RequestError(f"{name} must be 'all', numbers like 0,5,-1 or a range like 2-4; "
                               f"got {show(raw)}") from None
    return parse


def messages(raw) -> tuple[dict, ...]:
    """A conversation: [{"role": system | user | assistant, "content": text}, ...], ending with the user's."""
    if not isinstance(raw, (list, tuple)) or not raw:
        raise RequestError("the conversation is empty")
    if len(raw) > MAX_CHAT_SENT:          # the model reads the latest MAX_CHAT_MESSAGES (Prompts.conversation)
        raise RequestError(f"at most {MAX_CHAT_SENT} messages; got {len(raw)}")
    for m in raw:
        if not isinstance(m, dict) or m.get("role") not in CHAT_ROLES or not isinstance(m.get("content"), str):
            raise RequestError("each message must be {'role': 'system' | 'user' | 'assistant', 'content': text}")
        _message_text(m["content"])
    if raw[-1]["role"] != "user" or not raw[-1]["content"].strip():
        raise RequestError("the conversation must end with a user message that is not empty")
    return tuple({"role": m["role"], "content": m["content"]} for m in raw)


_message_text = text("a message", MAX_PROMPT_CHARS, empty_ok=True)


# -- forcing tokens (a branch: service/branching.py) -------------------------------------------------------

Force = tuple[int, "int | str"]          # (generated step, token id or a word as typed)


def force(raw, max_step: int) -> Force:
    """One forced token: 'STEP=WORD' (WORD kept as typed, spaces included: read as the model would write it after
    the text there, its first token: service/prompts.py's `word`) or 'STEP=#ID' (a token id), STEP counted from 0
    over the generated tokens; or such a pair as read already."""
    if isinstance(raw, (tuple, list)) and len(raw) == 2 and isinstance(raw[1], str):
        return force(f"{whole('a forced step', 0, max_step)(raw[0])}={raw[1]}", max_step)
    if isinstance(raw, (tuple, list)) and len(raw) == 2 and type(raw[1]) is int and raw[1] >= 0:
        return force(f"{whole('a forced step', 0, max_step)(raw[0])}=#{raw[1]}", max_step)
    if not isinstance(raw, str) or "=" not in raw:
        raise RequestError(f"a forced token is STEP=WORD or STEP=#ID (like 2=Paris or 2=#7042); got {show(raw)}")
    step_text, word = raw.split("=", 1)
    step = whole("a forced step", 0, max_step)(step_text.strip())
    if word.startswith("#") and word[1:].isascii() and word[1:].isdigit():
        return step, whole("a forced token id", 0, (1 << 31) - 1)(word[1:])
    if not word:
        raise RequestError(f"force {step}= names no token")
    return step, _force_word(word)


_force_word = text("a forced word", MAX_TARGET_CHARS)


def forces(max_count: int, max_step: int) -> Callable[[Any], tuple[Force, ...]]:
    """Tokens forced at generated steps, earliest first: one 'STEP=WORD' / 'STEP=#ID' text, or a list of them."""
    def parse(raw) -> tuple[Force, ...]:
        items = [raw] if isinstance(raw, str) else raw
        if not isinstance(items, (list, tuple)):
            raise RequestError(f"force takes STEP=WORD texts (like 2=Paris); got {show(raw)}")
        chain = tuple(force(item, max_step) for item in items if not (isinstance(item, str) and not item.strip()))
        if len(chain) > max_count:
            raise RequestError(f"at most {max_count} forced tokens; got {len(chain)}")
        steps = [step for step, _ in chain]
        if steps != sorted(set(steps)):
            raise RequestError(f"forced steps must increase, one token each; got steps {steps}")
        return chain
    return parse


def branches(max_count: int, max_forces: int, max_step: int) -> Callable[[Any], tuple[tuple[Force, ...], ...]]:
    """A page's branches, as a link carries them: chains of forced token ids separated by ';', each chain's
    forces by ',' ('3=#7042;3=#7042,9=#13'). Each force is read by `force`, and must name a token id."""
    chain = forces(max_forces, max_step)

    def parse(raw) -> tuple[tuple[Force, ...], ...]:
        if not isinstance(raw, str):
            raise RequestError(f"branches must be text like 3=#7042;5=#13; got {type(raw).__name__}")
        out = tuple(chain([f for f in part.split(",") if f.strip()]) for part in raw.split(";") if part.strip())
        if len(out) > max_count:
            raise RequestError(f"at most {max_count} branches; got {len(out)}")
        if any(not isinstance(token, int) for forced in out for _, token in forced):
            raise RequestError("a link's branches name token ids (3=#7042), not words")
        if any(not forced for forced in out):
            raise RequestError("a branch forces no token")
        return out
    return parse


def branches_text(chains) -> str:
    """Branches as a link writes them (the inverse of `branches`): '3=#7042;3=#7042,9=#13'."""
    return ";".join(",".join(f"{step}=#{token}" for step, token in chain) for chain in chains)

"""Every field a request may carry, declared once: its name, default, bounds, parser, help and examples.

The request dataclasses (`requests.py`) declare their fields from here; the API's endpoints
(`ui/api.py`), the CLI's flags (`cli.py`), the permalink codec (`ui/permalinks.py`) and the tabs take
theirs from the same declarations, and every surface reads a value with the field's one parser. So a
value gets the same answer wherever it comes from: a link, the API, the command line or a form.
`tests/test_fields.py` walks the schema and checks each surface against it.

A parser takes what a surface hands over (text from a link or the command line, a JSON value from the
API, a component's value from a form) and returns the field's value, or raises `RequestError` with one
line that names the field. `None` means "not given": the field's default (a required field says so).
Nothing here needs a model: layers are checked against one in `planning.py`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from dataclasses import field as dataclass_field
from typing import Any, Callable

from ..config import (
    LENS_CHOICES,
    MAX_ALPHA,
    MAX_CHAT_MESSAGES,
    MAX_GENERATE_TOKENS,
    MAX_K,
    MAX_LAYERS_CHARS,
    MAX_PROMPT_CHARS,
    MAX_SEED,
    MAX_SWEEP,
    MAX_TARGET_CHARS,
    MAX_TARGETS,
    MAX_TEMPERATURE,
    PUNCTUATION_WIDTH,
)


class RequestError(ValueError):
    """The caller's input cannot be served; the message says why, in one line."""


@dataclass(frozen=True)
class Field:
    """One request field. `parse(raw)` -> value or RequestError; `examples`: (raw, value) pairs it must
    accept; `hostile`: raw values every surface must refuse in one line. `flag`: its command-line flag
    ("" when it is positional or not on the command line)."""

    name: str
    help: str
    default: Any
    parse: Callable[[Any], Any]
    examples: tuple = dataclass_field(default=(), repr=False, compare=False)
    hostile: tuple = dataclass_field(default=(), repr=False, compare=False)
    flag: str = ""
    required: bool = False

    def __call__(self, raw) -> Any:
        if raw is None:
            if self.required:
                raise RequestError(f"no {self.name} given")
            return self.default
        return self.parse(raw)

    def declared(self):
        """This field as a dataclass field of a request (its default, and itself in the metadata)."""
        default = self.default
        if isinstance(default, (list, dict)):
            return dataclass_field(default_factory=lambda: type(default)(default), metadata={"field": self})
        return dataclass_field(default=default, metadata={"field": self})


def fields_of(cls) -> dict[str, Field]:
    """A request class's fields, in declaration order."""
    return {f.name: f.metadata["field"] for f in cls.__dataclass_fields__.values() if "field" in f.metadata}


# -- parsers -----------------------------------------------------------------------------------------

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


_LAYER_PART = re.compile(r"all|last|-?\d+|-?\d+--?\d+")


def layers(raw) -> str:
    """A layer selection as text: 'all', 'last', '3', '0,5,-1', '10-20' (checked against a model in planning)."""
    if not isinstance(raw, str):
        raise RequestError(f"layers must be text like 'all', '0,5,-1' or '10-20'; got {type(raw).__name__}")
    if len(raw) > MAX_LAYERS_CHARS:
        raise RequestError(f"the layer selection has {len(raw)} characters; the limit is {MAX_LAYERS_CHARS}")
    selection = raw.strip() or "all"
    parts = [p for p in selection.lower().replace(" ", "").split(",") if p]
    if not parts or not all(_LAYER_PART.fullmatch(p) for p in parts):
        raise RequestError(f"layers must be 'all', numbers like 0,5,-1 or a range like 10-20; got {show(selection)}")
    return selection


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
    return tuple(PROMPT(p) for p in items)


CHAT_ROLES = ("system", "user", "assistant")


def numbers(name: str, lo: float, hi: float, max_count: int) -> Callable[[Any], tuple[float, ...]]:
    """1..max_count numbers in lo..hi: comma-separated text, a list, or one number."""
    one = number(name, lo, hi)

    def parse(raw) -> tuple[float, ...]:
        items = [raw] if not isinstance(raw, (list, tuple)) else raw
        items = [t for item in items for t in (item.split(",") if isinstance(item, str) else [item])
                 if not isinstance(t, str) or t.strip()]
        if not items or len(items) > max_count:
            raise RequestError(f"{name} takes 1 to {max_count} values; got {len(items)}")
        return tuple(one(x) for x in items)
    return parse


def indices(name: str) -> Callable[[Any], str]:
    """Positions in a prompt as text, like layers: 'all', '3', '-1', '2-4' (checked against the prompt later)."""
    def parse(raw) -> str:
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
    if len(raw) > MAX_CHAT_MESSAGES:
        raise RequestError(f"at most {MAX_CHAT_MESSAGES} messages; got {len(raw)}")
    for m in raw:
        if not isinstance(m, dict) or m.get("role") not in CHAT_ROLES or not isinstance(m.get("content"), str):
            raise RequestError("each message must be {'role': 'system' | 'user' | 'assistant', 'content': text}")
        _message_text(m["content"])
    if raw[-1]["role"] != "user" or not raw[-1]["content"].strip():
        raise RequestError("the conversation must end with a user message that is not empty")
    return tuple({"role": m["role"], "content": m["content"]} for m in raw)


_message_text = text("a message", MAX_PROMPT_CHARS, empty_ok=True)


def show(value, n: int = 40) -> str:
    """A value as a message quotes it: its repr, clipped to `n` characters; an integer too long to print
    (Python refuses past 4300 digits) by its size."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 3 * n:
        return f"a number of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    try:
        return clip(repr(value), n)
    except Exception:  # noqa: BLE001 - a value that cannot describe itself is named by its type
        return f"a {type(value).__name__}"


def clip(value: str, n: int = 40) -> str:
    return value if len(value) <= n else value[:n] + "…"


# -- the fields ----------------------------------------------------------------------------------------

SURROGATE, NUL, HUGE = "a\ud800b", "a\x00b", 10**5000

PROMPT = Field("prompt", "the text to read", "", text("the prompt", MAX_PROMPT_CHARS), required=True,
               examples=(("The capital of France is", "The capital of France is"), ("a\tb\nc", "a\tb\nc")),
               hostile=("", "   ", "x" * (MAX_PROMPT_CHARS + 1), NUL, SURROGATE, 7, ["a"]))
PROMPTS = Field("prompts", "the prompts, read together the same way", (), prompts, required=True,
                examples=((["A", "B"], ("A", "B")), ("A", ("A",))),
                hostile=([], ["A", ""], ["A", NUL], "   ", 3))
LENS = Field("lens", "logit | jacobian | both (with both and layers=all: the Jacobian lens's layers)", "logit",
             choice("lens", tuple(LENS_CHOICES), "logit, jacobian or both"), flag="--lens",
             examples=(("both", "both"),), hostile=("tuned", "", "LOGIT", 1))
LAYERS = Field("layers", "all | L,L,... | A-B (negative counts from the end)", "all", layers, flag="--layers",
               examples=(("all", "all"), ("0,5,-1", "0,5,-1"), ("10-20", "10-20"), ("", "all"), (" last ", "last")),
               hostile=("1;drop table", "x" * (MAX_LAYERS_CHARS + 1), "nan", "1.5", 3, ["1"]))
K = Field("k", f"top-k tokens per cell (1..{MAX_K})", 5, whole("k", 1, MAX_K), flag="--k",
          examples=((5, 5), ("7", 7), (3.0, 3), ("2.0", 2)),
          hostile=(0, -3, MAX_K + 1, "five", "nan", "inf", 1.5, True, HUGE, "9" * 5000))
TARGETS = Field("targets", "words to score at every cell (comma-separated)", (), targets, flag="--target",
                examples=(("Paris, Rome", ("Paris", "Rome")), ("", ()), (" , ", ()),
                          (["Paris", "Rome, Oslo"], ("Paris", "Rome", "Oslo"))),
                hostile=(",".join("abcdefghijk"), "x" * (MAX_TARGET_CHARS + 1), "a\x01b", SURROGATE, 5, [3]))
CHAT = Field("chat", "wrap the prompt in the tokenizer's chat template (instruct models)", False, flag("chat"),
             flag="--chat", examples=((True, True), ("1", True), ("no", False), (0, False)),
             hostile=("maybe", 2, "2", [True]))
SKIP_PUNCTUATION = Field("skip_punctuation", "each cell shows the best of the top "
                         f"{PUNCTUATION_WIDTH} tokens that is not punctuation or whitespace, with its rank (the "
                         "top-k stays the true one)", False, flag("skip_punctuation"), flag="--skip-punctuation",
                         examples=((True, True), ("1", True), ("0", False)), hostile=("some", 2, [1]))
RAW = Field("raw", "raw logits: norm(h) @ W_U.T, skipping the family's logit arithmetic (soft-capping, scale)",
            False, flag("raw"), flag="--raw", examples=((False, False), ("true", True)), hostile=("x", -1))
MAX_TOKENS = Field("max_tokens", f"tokens to generate (1..{MAX_GENERATE_TOKENS})", 8,
                   whole("max_tokens", 1, MAX_GENERATE_TOKENS), flag="--max-tokens",
                   examples=((8, 8), ("64", 64)), hostile=(0, MAX_GENERATE_TOKENS + 1, "lots", -1, HUGE))
TEMPERATURE = Field("temperature", f"0 = greedy, up to {MAX_TEMPERATURE:g}", 0.0,
                    number("temperature", 0.0, MAX_TEMPERATURE), flag="--temperature",
                    examples=((0.7, 0.7), ("0", 0.0), (2, 2.0)), hostile=("nan", "inf", -1, 2.5, "hot", True))
SEED = Field("seed", "sampling seed: the same seed gives the same text (none: a fresh sample each time)", None,
             optional_whole("seed", 0, MAX_SEED), flag="--seed",
             examples=((7, 7), ("", None), ("4294967295", MAX_SEED)), hostile=(-1, MAX_SEED + 1, "x", 1.5))
MESSAGES = Field("messages", "the conversation: [{role, content}, ...], ending with the user's", (), messages,
                 required=True, examples=(([{"role": "user", "content": "Hi"}], ({"role": "user", "content": "Hi"},)),),
                 hostile=([], [{"role": "robot", "content": "x"}], [{"role": "user", "content": ""}], "Hi"))
CHAT_LENS = Field("lens", "the readout's lens: jacobian | logit", "jacobian",
                  choice("the chat readout", ("logit", "jacobian"), "one lens, logit or jacobian"),
                  examples=(("logit", "logit"),), hostile=("both", "tuned"))
CHAT_LAYER = Field("layer", "the readout's layer (negative counts from the end; none: about two thirds of the depth)",
                   None, optional_whole("the chat layer", -(1 << 20), 1 << 20),
                   examples=((-10, -10), ("", None), ("3", 3)), hostile=("x", 1.5, True))
CHAT_MAX_TOKENS = replace(MAX_TOKENS, default=32)
CHAT_K = replace(K, default=3)

# -- interventions (service/intervening.py) --------------------------------------------------------------

INTERVENTIONS = ("steer", "ablate", "patch")
DIRECTIONS = ("logit", "jacobian", "fitted")
KIND = Field("intervention", "steer (add a direction), ablate (remove it) or patch (copy cells from a source prompt)",
             "steer", choice("intervention", INTERVENTIONS), examples=(("patch", "patch"),), hostile=("erase", ""))
WORD = Field("word", "the word whose direction is added (steer) or removed (ablate)", "",
             text("the word", MAX_TARGET_CHARS, empty_ok=True), examples=((" Rome", " Rome"), ("", "")),
             hostile=("x" * (MAX_TARGET_CHARS + 1), NUL, 5))
FROM_WORD = Field("from_word", "steer from this word toward `word`: the difference of their directions", "",
                  text("the from word", MAX_TARGET_CHARS, empty_ok=True), flag="--from",
                  examples=(("Paris", "Paris"),), hostile=(NUL, SURROGATE))
DIRECTION = Field("direction", "a word's logit-lens direction (its unembedding row through the final norm's scale), "
                  "its Jacobian-lens direction (J_l^T of that), or a vector fitted to make the lens read it",
                  "logit", choice("direction", DIRECTIONS), flag="--direction",
                  examples=(("jacobian", "jacobian"),), hostile=("random", 1))
OBJECTIVE = Field("objective", "what a fitted vector must make read the word: the lens at its layer, or the output",
                  "output", choice("objective", ("lens", "output")), flag="--objective",
                  examples=(("lens", "lens"),), hostile=("loss",))
SPAN = Field("layer", "the layer, or a span of layers (L-L2), whose output is changed", "",
             indices("layer"), flag="--layer", required=True,
             examples=(("20", "20"), ("18-22", "18-22"), ("-5", "-5"), (22, "22")), hostile=("twenty", "1;2", 1.5, ""))
ALPHAS = Field("alphas", "steering strengths: the added vector's length in units of the layer's typical residual norm "
               f"(comma-separated, up to {MAX_SWEEP}: a dose-response sweep)", (0.0, 0.1, 0.2, 0.4, 0.8),
               numbers("alpha", -MAX_ALPHA, MAX_ALPHA, MAX_SWEEP), flag="--alpha",
               examples=(("0,4,8", (0.0, 4.0, 8.0)), (2, (2.0,)), ([0, 0.5], (0.0, 0.5))),
               hostile=("", "nan", "1," * 13, str(MAX_ALPHA + 1), "big"))
POSITIONS = Field("positions", "the prompt positions changed: all, P, P-P2 (negative counts from the end)", "all",
                  indices("positions"), flag="--position",
                  examples=(("all", "all"), ("-1", "-1"), ("2-4", "2-4")), hostile=("first", "1.5"))
PROMPT_ONLY = Field("prompt_only", "steer the prompt only, not the tokens a generation adds", False,
                    flag("prompt_only"), flag="--prompt-only", examples=((True, True),), hostile=("maybe",))
ABLATION = Field("ablation", "remove the component along the direction (project), or set it to its mean over a "
                 "reference text (mean)", "project", choice("ablation", ("project", "mean")), flag="--ablation",
                 examples=(("mean", "mean"),), hostile=("zero",))
REFERENCE = Field("reference", "the text whose mean a mean ablation uses (empty: a paragraph of general English)", "",
                  text("the reference", MAX_PROMPT_CHARS, empty_ok=True), flag="--reference",
                  examples=(("Some text.", "Some text."),), hostile=(NUL,))
SOURCE = Field("source", "patch: the prompt whose cells are copied", "",
               text("the source prompt", MAX_PROMPT_CHARS, empty_ok=True), flag="--patch-from",
               examples=(("The Eiffel Tower is in", "The Eiffel Tower is in"),), hostile=(NUL, SURROGATE))
SOURCE_POSITIONS = Field("source_positions", "patch: the source's positions (empty: as many as the target's, aligned "
                         "at the end)", "", lambda raw: "" if isinstance(raw, str) and not raw.strip()
                         else indices("source_positions")(raw), flag="--source-position",
                         examples=(("", ""), ("3-5", "3-5")), hostile=("x",))
NEW_TOKENS = Field("new_tokens", f"tokens to generate with and without the intervention (0..{MAX_GENERATE_TOKENS}: "
                   "none)", 0, whole("new_tokens", 0, MAX_GENERATE_TOKENS), flag="--max-tokens",
                   examples=((0, 0), ("16", 16)), hostile=(-1, MAX_GENERATE_TOKENS + 1, "some"))

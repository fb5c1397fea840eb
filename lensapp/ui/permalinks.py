"""Share-this-view links: the whole state of a tab in the URL query, nothing stored on the server.

    encode(view) -> {"v": "1", "tab": "logit", "prompt": ..., ...}    (then `query_string`)
    decode(query) -> (view, notices)

`decode` never raises: every missing, malformed or hostile value (unknown tab, k=-3, layers
outside the model, a 100 kB prompt, bytes that are not UTF-8) falls back to its default and
adds a one-line notice the page shows. Format versions: v=1 is the current one; a link with
no `v` is read as v=1; a newer version is read as far as its fields are understood.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Mapping, NamedTuple
from urllib.parse import parse_qsl, quote, urlencode

from .. import config
from ..charts import METRICS
from ..service.requests import RequestError, parse_layers

FORMAT_VERSION = 1
TABS = ("logit", "jacobian", "generate", "compare")
LENSES = tuple(config.LENS_CHOICES)
DEFAULT_PROMPT = "The capital of France is"
DEFAULT_COMPARE = ("The capital of France is", "The capital of Italy is")
# Which fields a tab's link carries (the rest are that tab's defaults). Fields are only ever added:
# a link of an earlier release still opens (what it does not name takes its default).
TAB_FIELDS = {
    "logit": ("prompt", "layers", "k", "targets", "metric", "chat", "raw", "start"),
    "jacobian": ("prompt", "layers", "k", "targets", "metric", "chat", "raw", "start"),
    "generate": ("prompt", "max_tokens", "temperature", "seed", "lens", "layers", "k", "chat", "raw"),
    "compare": ("prompts", "lens", "layers", "k", "targets", "metric", "chat", "raw"),
}


@dataclass(frozen=True)
class View:
    """Everything a tab needs to reproduce a readout. Empty means empty: targets default to none."""

    tab: str = "logit"
    prompt: str = DEFAULT_PROMPT
    layers: str = "all"
    k: int = 5
    targets: str = ""
    metric: str = "top1_prob"
    lens: str = "logit"
    max_tokens: int = 8
    temperature: float = 0.0
    chat: bool = False
    seed: int | None = None          # sampling seed (generation with temperature > 0)
    raw: bool = False                # raw logits: norm(h) @ W_U.T without the family's logit arithmetic
    start: int | None = None         # first position drawn of a long prompt (None: the last ones)
    prompts: tuple[str, ...] = DEFAULT_COMPARE     # the compare tab's prompts (prompt1, prompt2, ... in a link)


def encode(view: View) -> dict[str, str]:
    """The query parameters of a link to `view` (only the fields its tab uses, and no empty optional ones)."""
    out = {"v": str(FORMAT_VERSION), "tab": view.tab}
    for name in TAB_FIELDS.get(view.tab, ()):
        value = getattr(view, name)
        if name == "prompts":
            out.update({f"prompt{i}": p for i, p in enumerate(value, 1)})
            continue
        if value is None:
            continue
        if isinstance(value, bool):
            value = "1" if value else "0"
        elif isinstance(value, float):
            value = f"{value:g}"
        out[name] = str(value)
    return out


def query_string(view: View) -> str:
    # A lone surrogate (a browser can send one) is kept as the bytes it stands for: the link then opens
    # with a notice that the field is not UTF-8 text, instead of this failing.
    return urlencode(encode(view), quote_via=quote, errors="surrogatepass")


class Decoded(NamedTuple):
    view: View
    notices: list[str]          # one line per value that fell back to its default


def decode(query: Mapping[str, str] | str | None, *, n_layers: int | None = None,
           jlens_layers: list[int] | None = None) -> Decoded:
    """Read a link's query (a mapping, or the raw `a=1&b=2` text) into a View, never raising.

    n_layers / jlens_layers, when given, check `layers` against the running model (and, on the
    jacobian tab, against the layers the J-lens has).
    """
    notices: list[str] = []
    params = _params(query, notices)
    if not params:
        return Decoded(View(), notices)
    d = View()
    values: dict = {}

    def fail(name: str, why: str) -> None:
        notices.append(f"The link's {name} {why}; using the default ({_show(getattr(d, name))}).")

    version = params.get("v", str(FORMAT_VERSION))
    if not (version.isascii() and version.isdigit() and len(version) <= 9) or int(version) < 1:
        notices.append(f"The link's format version v={_printable(version)} is not one this app knows; "
                       "reading it as v=1.")
    elif int(version) > FORMAT_VERSION:
        notices.append(f"The link was made by a newer version of the app (v={int(version)}); "
                       "settings it does not understand are left at their defaults.")

    for name in _PARSERS:
        if name not in params:
            continue
        raw = params[name]
        # U+FFFD: bytes the web server could not decode; a lone surrogate: a raw query or mapping holding one
        if any(ch == "\ufffd" or 0xD800 <= ord(ch) <= 0xDFFF for ch in raw):
            fail(name, "has bytes that are not UTF-8 text")
            continue
        try:
            values[name] = _PARSERS[name](raw)
        except ValueError as e:
            fail(name, str(e))

    prompts = _compare_prompts(params, notices)
    if prompts:
        values["prompts"] = prompts
    view = replace(d, **values)
    if "layers" in values and n_layers is not None:
        try:
            layers = parse_layers(view.layers, n_layers)
            if view.tab == "jacobian" and jlens_layers and not set(layers) & set(jlens_layers):
                raise RequestError(f"none of them has a Jacobian lens; it covers {', '.join(map(str, jlens_layers))}")
        except RequestError as e:
            notices.append(f"The link's layers do not fit this model ({e}); using all layers.")
            view = replace(view, layers="all")
    return Decoded(view, notices)


# -- parsers: raw text -> value, or ValueError saying what is wrong ---------------------------------

def _params(query, notices: list[str]) -> dict[str, str]:
    if query is None:
        return {}
    if isinstance(query, str):
        query = query.lstrip("?")
        try:
            pairs = parse_qsl(query, keep_blank_values=True, errors="strict", max_num_fields=100)
        except UnicodeDecodeError:
            pairs = parse_qsl(query, keep_blank_values=True, errors="replace", max_num_fields=100)
        except ValueError:
            notices.append("The link has too many parameters; it was ignored.")
            return {}
        return dict(pairs)
    try:
        return {str(k): str(v) for k, v in query.items()}
    except Exception:  # noqa: BLE001 - a query object we cannot read is just no query
        notices.append("The link's parameters could not be read; it was ignored.")
        return {}


def _choice(options):
    def parse(raw: str) -> str:
        if raw not in options:
            raise ValueError(f"{_short(raw)!r} is not one of {', '.join(options)}")
        return raw
    return parse


def _int(lo: int, hi: int):
    def parse(raw: str) -> int:
        try:
            value = int(raw.strip())
        except ValueError:
            raise ValueError(f"{_short(raw)!r} is not a whole number") from None
        if not lo <= value <= hi:
            raise ValueError(f"{_short(str(value))} is outside {lo}..{hi}")
        return value
    return parse


def _temperature(raw: str) -> float:
    try:
        value = float(raw.strip())
    except ValueError:
        raise ValueError(f"{_short(raw)!r} is not a number") from None
    if not math.isfinite(value) or not 0.0 <= value <= config.MAX_TEMPERATURE:
        raise ValueError(f"{value:g} is outside 0..{config.MAX_TEMPERATURE:g}")
    return value


def _prompt(raw: str) -> str:
    if len(raw) > config.MAX_PROMPT_CHARS:
        raise ValueError(f"is {len(raw)} characters long; the limit is {config.MAX_PROMPT_CHARS}")
    if not raw.strip():
        raise ValueError("is empty")
    if any(ord(ch) < 0x20 and ch not in "\n\t\r" for ch in raw):
        raise ValueError("contains control characters")
    return raw


def _layers(raw: str) -> str:
    text = raw.strip()
    if len(text) > config.MAX_LAYERS_CHARS or not text:
        raise ValueError("is empty" if not text else "is too long")
    if text.lower() != "all" and not set(text.lower()) <= set("0123456789,- last"):
        raise ValueError(f"{_short(text)!r} is not 'all', a list like 0,5,-1 or a range like 10-20")
    return text


def _targets(raw: str) -> str:
    if len(raw) > config.MAX_TARGET_CHARS:
        raise ValueError(f"are {len(raw)} characters long; the limit is {config.MAX_TARGET_CHARS}")
    parts = [t for t in raw.split(",") if t.strip()]
    if len(parts) > config.MAX_TARGETS:
        raise ValueError(f"are {len(parts)} words; the limit is {config.MAX_TARGETS}")
    if any(ord(ch) < 0x20 for ch in raw):
        raise ValueError("contain control characters")
    return raw


def _compare_prompts(params: dict[str, str], notices: list[str]) -> tuple[str, ...]:
    """prompt1, prompt2, ... in order; () when the link names none (or too few: with a notice)."""
    keys = [f"prompt{i}" for i in range(1, config.MAX_COMPARE_PROMPTS + 1) if f"prompt{i}" in params]
    if not keys:
        return ()
    prompts = []
    for key in keys:
        raw = params[key]
        try:
            if "\ufffd" in raw:
                raise ValueError("has bytes that are not UTF-8 text")
            prompts.append(_prompt(raw))
        except ValueError as e:
            notices.append(f"The link's {key} {e}; it was left out.")
    if len(prompts) < 2:
        notices.append(f"The link compares fewer than two prompts; using the examples ({', '.join(DEFAULT_COMPARE)}).")
        return ()
    return tuple(prompts)


def _optional_int(lo: int, hi: int):
    whole = _int(lo, hi)

    def parse(raw: str) -> int | None:
        return None if not raw.strip() else whole(raw)
    return parse


def _bool(raw: str) -> bool:
    low = raw.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"{_short(raw)!r} is not 1 or 0")


_PARSERS = {
    "tab": _choice(TABS), "prompt": _prompt, "layers": _layers, "k": _int(1, config.MAX_K), "targets": _targets,
    "metric": _choice(tuple(METRICS)), "lens": _choice(LENSES), "max_tokens": _int(1, config.MAX_GENERATE_TOKENS),
    "temperature": _temperature, "chat": _bool, "seed": _optional_int(0, config.MAX_SEED), "raw": _bool,
    "start": _optional_int(0, 1 << 20),
}
assert set(_PARSERS) | {"prompts"} == {f.name for f in fields(View)}


def _short(text: str, n: int = 40) -> str:
    return text if len(text) <= n else text[:n] + "…"


def _printable(text: str) -> str:
    """Clipped, and quoted with escapes when it holds a line break or another unprintable character."""
    return _short(text) if text.isprintable() else repr(_short(text))


def _show(value) -> str:
    if isinstance(value, str):
        return repr(_short(value)) if value else "none"
    return str(value)

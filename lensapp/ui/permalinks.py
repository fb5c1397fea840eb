"""Share-this-view links: the whole state of a tab in the URL query, nothing stored on the server.

    encode(view) -> {"v": "2", "tab": "logit", "prompt": ..., ...}    (then `query_string`)
    decode(query, **as_read_by(service)) -> (view, notices)

A tab's link carries the fields its declaration names (`views.py`: its request kind's fields, in their
published order, but the ones it omits, and what only a view has: the colour metric, the first position
drawn), each read with the field's one parser, as the API and the command line read it; any link may
also carry a title and a note. A spread field takes numbered keys (a comparison's prompt1, prompt2, ...).
`decode` never raises: every missing, malformed or hostile value (an unknown tab, k=-3, layers outside
the model, a 100 kB prompt, bytes that are not UTF-8) falls back to its default and adds a one-line
notice the page shows. Fields are only ever added: a link of an earlier release still opens (what it does
not name takes its default), and means what it meant: its format version (`v`; a link with none is v=1)
says how its positions count (FORMAT_VERSION), and `decode` moves an older link's positions to name the
tokens they named then. A newer version is read as far as its fields are understood.
"""

from __future__ import annotations

from typing import Mapping, NamedTuple
from urllib.parse import parse_qsl, quote, urlencode

from .. import config
from ..charts import METRICS
from ..service import fields as f
from ..service.field import RequestError, clip
from ..service.prompts import Prompts
from ..service.selection import Selection
from .views import (
    BRANCHES,
    DEFAULT_COMPARE,
    DEFAULT_PROMPT,
    METRIC,
    NOTE,
    NOTE_FIELDS,
    QUIET_WHEN_EMPTY,
    SHORT_NAMES,
    SPREAD,
    START,
    TAB,
    TAB_VIEWS,
    TITLE,
    TOKEN_POSITIONS,
    View,
    as_text,
    spread_keys,
    tab_fields,
    view_fields,
)

# How a link's positions (views.TOKEN_POSITIONS) count a prompt's tokens, by format version:
#   v=1 (and a link with no `v`): the prompt's own tokens (the tokenizer's, or the chat template's);
#   v=2: the tokens the app reads, BOS first where it reads with BOS (service/prompts.py: then position 0 is the BOS).
# Negative positions count from the end in every version. Any later change of what a position (or any other
# field) names bumps FORMAT_VERSION, adds its line here and its step to `_UPGRADES`, and pins one link of the
# new version in tests/test_link_versions.py.
FORMAT_VERSION = 2
TABS = config.TABS


def encode(view: View) -> dict[str, str]:
    """The query parameters of a link to `view` (only the fields its tab uses, and no empty optional ones)."""
    out = {"v": str(FORMAT_VERSION), "tab": view.tab}
    for name in tab_fields(view.tab):
        value = getattr(view, name)
        if name in SPREAD:
            out.update(zip(spread_keys(name), value))
        elif value is not None and not (name in QUIET_WHEN_EMPTY and not value):
            out[name] = as_text(value)
    out.update({name: getattr(view, name) for name in NOTE_FIELDS if getattr(view, name)})
    return out


def query_string(view: View) -> str:
    # A lone surrogate (a browser can send one) is kept as the bytes it stands for: the link then opens
    # with a notice that the field is not UTF-8 text, instead of this failing.
    return urlencode(encode(view), quote_via=quote, errors="surrogatepass")


class Decoded(NamedTuple):
    view: View
    notices: list[str]          # one line per value that fell back to its default


def decode(query: Mapping[str, str] | str | None, *, n_layers: int | None = None,
           jlens_layers: list[int] | None = None, prompts: Prompts | None = None) -> Decoded:
    """Read a link's query (a mapping, or the raw `a=1&b=2` text) into a View, never raising.

    n_layers / jlens_layers, when given, check `layers` against the running model (and, on the
    jacobian tab, against the layers the J-lens has). prompts, when given, is how the app reads a prompt
    (the service's): an older link's positions are moved to name in it the tokens they named then.
    """
    notices: list[str] = []
    params = _params(query, notices)
    if not params:
        return Decoded(View(), notices)
    version = _version(params.get("v", "1"), notices)
    values: dict = {}
    for name, field in view_fields().items():
        if name in params and name not in SPREAD:
            try:
                values[name] = field(_utf8(params[name]))
            except RequestError as e:
                notices.append(f"The link's {name} was left at its default ({_show(field.default)}): {e}.")
    compared = _compare_prompts(params, notices)
    if compared:
        values["prompts"] = compared
    view = View(**values)
    if prompts is not None:
        for step in _UPGRADES[version - 1:]:
            view = step(view, [name for name in TOKEN_POSITIONS if name in values], prompts, notices)
    if "layers" in values and n_layers is not None:
        view = _fit_layers(view, n_layers, jlens_layers, notices)
    return Decoded(view, notices)


def as_read_by(service) -> dict:
    """`decode`'s keywords for a link opened on `service`'s app: its model's layers, its Jacobian lens's and how it
    reads a prompt (so an older link's positions name what they named)."""
    return {"n_layers": service.info.n_layers, "jlens_layers": service.jlens_layers, "prompts": service.prompts}


def _version(version: str, notices: list[str]) -> int:
    """The link's format version, as far as this app reads it: one it does not know is read as v=1 (the oldest),
    a newer one as this app's own."""
    if not (version.isascii() and version.isdigit() and len(version) <= 9) or int(version) < 1:
        notices.append(f"The link's format version v={_printable(version)} is not one this app knows; "
                       "reading it as v=1.")
        return 1
    if int(version) > FORMAT_VERSION:
        notices.append(f"The link was made by a newer version of the app (v={int(version)}); "
                       "settings it does not understand are left at their defaults.")
        return FORMAT_VERSION
    return int(version)


def _bos_first(view: View, named: list[str], prompts: Prompts, notices: list[str]) -> View:
    """v=1 -> v=2: the positions a v=1 link names (`named`), counted in the prompt's own tokens, moved on past the
    BOS the app now reads before them (none where it reads without BOS, or the text already starts with it)."""
    fields, changes = view_fields(), {}
    for name in named:
        text = getattr(view, TOKEN_POSITIONS[name])
        value = getattr(view, name)
        moved = _moved(value, _tokens_before(prompts, text, view.chat))
        if moved == value:
            continue
        try:
            changes[name] = fields[name](moved)
        except RequestError as e:
            changes[name] = fields[name].default
            notices.append(f"The link's {name} was left at its default ({_show(fields[name].default)}): {e}.")
    return view.replace(**changes) if changes else view


# Each step reads a link of one version as the next version does: _UPGRADES[v - 1] takes v to v + 1.
_UPGRADES = (_bos_first,)


def _tokens_before(prompts: Prompts, text: str, chat: bool) -> int:
    """How many tokens the app reads before `text`'s own (as v=1 counted them): 1 where it puts a BOS first."""
    if not (prompts.bos and text):
        return 0
    as_tokenized = Prompts(prompts.tokenizer, prompts.max_prompt_tokens, bos=False)
    try:
        return len(prompts.ids(text, chat)) - len(as_tokenized.ids(text, chat))
    except RequestError:              # a prompt the readout itself refuses (too long, no chat template)
        return 0


def _moved(value, by: int):
    """A position field's value with each position counted from the start moved on by `by` (one counted from
    the end names the same token whatever comes first): 4 -> 5, '0-2,-1' -> '1-3,-1', 'all' -> 'all'."""
    if not by or value is None or value == "":
        return value
    if isinstance(value, int):
        return value + by if value >= 0 else value

    def on(i: int) -> int:
        return i + by if i >= 0 else i
    parts = [f"{on(p[0])}-{on(p[1])}" if isinstance(p, tuple) else str(on(p)) if isinstance(p, int) else p
             for p in Selection(value).parts]
    return ",".join(parts)


def _utf8(raw: str) -> str:
    """U+FFFD: bytes the web server could not decode (a lone surrogate is the field parser's to refuse)."""
    if "\ufffd" in raw:
        raise RequestError("it has bytes that are not UTF-8 text")
    return raw


def _fit_layers(view: View, n_layers: int, jlens_layers: list[int] | None, notices: list[str]) -> View:
    try:
        layers = Selection(view.layers).resolve(n_layers)
        if view.tab == "jacobian" and jlens_layers and not set(layers) & set(jlens_layers):
            raise RequestError(f"none of them has a Jacobian lens; it covers {', '.join(map(str, jlens_layers))}")
    except RequestError as e:
        notices.append(f"The link's layers do not fit this model ({e}); using all layers.")
        return view.replace(layers="all")
    return view


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


def _compare_prompts(params: dict[str, str], notices: list[str]) -> tuple[str, ...]:
    """prompt1, prompt2, ... in order; () when the link names none (or too few: with a notice)."""
    keys = [key for key in spread_keys(f.PROMPTS.name) if key in params]
    if not keys:
        return ()
    prompts = []
    for key in keys:
        try:
            prompts.append(f.PROMPT(_utf8(params[key])))
        except RequestError as e:
            notices.append(f"The link's {key} was left out: {e}.")
    if len(prompts) < 2:
        notices.append(f"The link compares fewer than two prompts; using the examples ({', '.join(DEFAULT_COMPARE)}).")
        return ()
    return tuple(prompts)


def _printable(text: str) -> str:
    """Clipped, and quoted with escapes when it holds a line break or another unprintable character."""
    return clip(text) if text.isprintable() else repr(clip(text))


def _show(value) -> str:
    if isinstance(value, tuple):
        return as_text(value) or "none"
    if isinstance(value, str):
        return repr(clip(value)) if value else "none"
    return str(value)


__all__ = ["BRANCHES", "DEFAULT_PROMPT", "METRIC", "METRICS", "NOTE", "SHORT_NAMES", "START", "TAB", "TABS",
           "TAB_VIEWS", "TITLE", "Decoded", "View", "as_read_by", "as_text", "decode", "encode", "query_string",
           "tab_fields", "view_fields"]

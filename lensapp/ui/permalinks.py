"""Share-this-view links: the whole state of a tab in the URL query, nothing stored on the server.

    encode(view) -> {"v": "1", "tab": "logit", "prompt": ..., ...}    (then `query_string`)
    decode(query) -> (view, notices)

A link's fields are request fields (`service/fields.py`), read with the same parsers as the API and
the command line, plus what only a view has (the tab, the colour metric, the first position drawn).
`decode` never raises: every missing, malformed or hostile value (an unknown tab, k=-3, layers outside
the model, a 100 kB prompt, bytes that are not UTF-8) falls back to its default and adds a one-line
notice the page shows. Format versions: v=1 is the current one; a link with no `v` is read as v=1; a
newer version is read as far as its fields are understood. Fields are only ever added: a link of an
earlier release still opens (what it does not name takes its default).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Mapping, NamedTuple
from urllib.parse import parse_qsl, quote, urlencode

from .. import config
from ..charts import METRICS
from ..service import fields as f
from ..service import parsers
from ..service.field import Field, RequestError, clip
from ..service.selection import Selection

FORMAT_VERSION = 1
TABS = config.TABS
DEFAULT_PROMPT = "The capital of France is"
DEFAULT_COMPARE = ("The capital of France is", "The capital of Italy is")
# The intervention the Intervene tab opens on: steer the capital of France toward Rome, two thirds of the way up.
DEFAULT_WORD, DEFAULT_SPAN = "Rome", "-8"

# What only a view has. The prompt(s) a page opens on are examples, not a request's defaults.
TAB = Field("tab", "which tab the link opens", "logit", parsers.choice("tab", TABS))
METRIC = Field("metric", "what colours the cells", "top1_prob", parsers.choice("metric", tuple(METRICS)))
START = Field("start", "the first position drawn of a long prompt (none: the last ones)", None,
              parsers.optional_whole("start", 0, 1 << 20))
VIEW_PROMPT = replace(f.PROMPT, default=DEFAULT_PROMPT, required=False)
VIEW_PROMPTS = replace(f.PROMPTS, default=DEFAULT_COMPARE, required=False)
VIEW_WORD = replace(f.WORD, default=DEFAULT_WORD)
VIEW_SPAN = replace(f.SPAN, default=DEFAULT_SPAN, required=False)
# A link's words, shown above its view (ui/notes.py): bounded text, shown as text, never stored.
TITLE = Field("title", f"the link's title, shown above its view (one line, up to {config.MAX_TITLE_CHARS} characters)",
              "", lambda raw: _one_line(parsers.text("the title", config.MAX_TITLE_CHARS, empty_ok=True)(raw)))
NOTE = Field("note", f"a note shown above the view (up to {config.MAX_NOTE_CHARS} characters; 'layer 22' or a token "
             "in backticks outlines its cells)", "", parsers.text("the note", config.MAX_NOTE_CHARS, empty_ok=True))
# A generation's branches (ui/branching.py): chains of forced token ids, as their text ('3=#7042;3=#7042,9=#13'),
# read by the force field's own parser (service/parsers.py).
_BRANCHES = parsers.branches(config.MAX_BRANCHES, config.MAX_FORCES, config.MAX_GENERATE_TOKENS - 1)
BRANCHES = Field("branches", "the generation's branches: for each, the steps forced and the token ids put there", "",
                 lambda raw: parsers.branches_text(_BRANCHES(raw)))
# Request fields a link names more briefly: link name -> the request field's name.
SHORT_NAMES = {"punct": f.SKIP_PUNCTUATION.name}
PUNCT = replace(f.SKIP_PUNCTUATION, name="punct")


@dataclass(frozen=True)
class View:
    """Everything a tab needs to reproduce a readout, as parsed values. Empty means empty: no targets."""

    tab: str = TAB.declared()
    prompt: str = VIEW_PROMPT.declared()
    layers: str = f.LAYERS.declared()
    k: int = f.K.declared()
    targets: tuple[str, ...] = f.TARGETS.declared()
    metric: str = METRIC.declared()
    lens: str = f.LENS.declared()
    max_tokens: int = f.MAX_TOKENS.declared()
    temperature: float = f.TEMPERATURE.declared()
    chat: bool = f.CHAT.declared()
    seed: int | None = f.SEED.declared()
    raw: bool = f.RAW.declared()
    start: int | None = START.declared()
    prompts: tuple[str, ...] = VIEW_PROMPTS.declared()      # the compare tab's (prompt1, prompt2, ... in a link)
    intervention: str = f.KIND.declared()
    word: str = VIEW_WORD.declared()
    layer: str = VIEW_SPAN.declared()
    alphas: tuple[float, ...] = f.ALPHAS.declared()
    direction: str = f.DIRECTION.declared()
    from_word: str = f.FROM_WORD.declared()
    objective: str = f.OBJECTIVE.declared()
    positions: str = f.POSITIONS.declared()
    prompt_only: bool = f.PROMPT_ONLY.declared()
    ablation: str = f.ABLATION.declared()
    reference: str = f.REFERENCE.declared()
    source: str = f.SOURCE.declared()
    source_positions: str = f.SOURCE_POSITIONS.declared()
    new_tokens: int = f.NEW_TOKENS.declared()
    punct: bool = PUNCT.declared()
    title: str = TITLE.declared()
    note: str = NOTE.declared()
    branches: str = BRANCHES.declared()


VIEW_FIELDS = f.fields_of(View)
# Which fields a tab's link carries (the rest are that tab's defaults). Only ever add fields.
TAB_FIELDS = {
    "logit": ("prompt", "layers", "k", "targets", "metric", "chat", "raw", "start", "punct"),
    "jacobian": ("prompt", "layers", "k", "targets", "metric", "chat", "raw", "start", "punct"),
    "generate": ("prompt", "max_tokens", "temperature", "seed", "lens", "layers", "k", "chat", "raw", "branches"),
    "compare": ("prompts", "lens", "layers", "k", "targets", "metric", "chat", "raw", "punct"),
    "intervene": ("prompt", "intervention", "word", "layer", "alphas", "direction", "from_word", "objective",
                  "positions",
                  "prompt_only", "ablation", "reference", "source", "source_positions", "lens", "layers", "k",
                  "targets", "metric", "new_tokens", "temperature", "seed", "chat", "raw"),
}
NOTE_FIELDS = ("title", "note")        # any tab's link may carry them (only when they are not empty)


def encode(view: View) -> dict[str, str]:
    """The query parameters of a link to `view` (only the fields its tab uses, and no empty optional ones)."""
    out = {"v": str(FORMAT_VERSION), "tab": view.tab}
    for name in TAB_FIELDS.get(view.tab, ()):
        value = getattr(view, name)
        if name == "prompts":
            out.update({f"prompt{i}": p for i, p in enumerate(value, 1)})
        elif value is not None and not (name == "branches" and not value):      # no branches: no key
            out[name] = as_text(value)
    out.update({name: getattr(view, name) for name in NOTE_FIELDS if getattr(view, name)})
    return out


def as_text(value) -> str:
    """A parsed value as a link (or a form's text box) writes it."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return ", ".join(as_text(x) for x in value)
    return str(value)


def query_string(view: View) -> str:
    # A lone surrogate (a browser can send one) is kept as the bytes it stands for: the link then opens
    # with a notice that the field is not UTF-8 text, instead of this failing.
    return urlencode(encode(view), quote_via=quote, errors="surrogatepass")


def view_of(tab: str, **values) -> View:
    """A View from a tab's input values mid-edit (an emptied box, a half-typed number): each value its
    field cannot read keeps the field's default. Never raises (the link follows every keystroke)."""
    parsed = {}
    for name, value in values.items():
        try:
            parsed[name] = VIEW_FIELDS[name](value)
        except (RequestError, TypeError, ValueError):
            continue
    return replace(View(tab=tab), **parsed)


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
    _check_version(params.get("v", str(FORMAT_VERSION)), notices)
    values: dict = {}
    for name, field in VIEW_FIELDS.items():
        if name in params and name != "prompts":
            try:
                values[name] = field(_utf8(params[name]))
            except RequestError as e:
                notices.append(f"The link's {name} was left at its default ({_show(field.default)}): {e}.")
    prompts = _compare_prompts(params, notices)
    if prompts:
        values["prompts"] = prompts
    view = replace(View(), **values)
    if "layers" in values and n_layers is not None:
        view = _fit_layers(view, n_layers, jlens_layers, notices)
    return Decoded(view, notices)


def _check_version(version: str, notices: list[str]) -> None:
    if not (version.isascii() and version.isdigit() and len(version) <= 9) or int(version) < 1:
        notices.append(f"The link's format version v={_printable(version)} is not one this app knows; "
                       "reading it as v=1.")
    elif int(version) > FORMAT_VERSION:
        notices.append(f"The link was made by a newer version of the app (v={int(version)}); "
                       "settings it does not understand are left at their defaults.")


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
        return replace(view, layers="all")
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
    keys = [f"prompt{i}" for i in range(1, config.MAX_COMPARE_PROMPTS + 1) if f"prompt{i}" in params]
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


def _one_line(text: str) -> str:
    if "\n" in text or "\r" in text:
        raise RequestError("the title must be one line")
    return text


def _printable(text: str) -> str:
    """Clipped, and quoted with escapes when it holds a line break or another unprintable character."""
    return clip(text) if text.isprintable() else repr(clip(text))


def _show(value) -> str:
    if isinstance(value, tuple):
        return as_text(value) or "none"
    if isinstance(value, str):
        return repr(clip(value)) if value else "none"
    return str(value)


assert set(VIEW_FIELDS) == {x.name for x in fields(View)}

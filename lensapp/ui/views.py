"""What each tab shows and what its link carries, declared once: its request kind, the request fields it
leaves out, and what only a view has.

    TabView("logit", "lens", omits=("lens",), extras=((METRIC, "targets"), (START, "raw")))

reads: the logit tab asks the `lens` kind (`service/kinds.py`) for every field of its request but the lens
(the tab sets it), and adds the colour metric after the targets and the first position drawn after raw.
Its inputs (`form.py` makes them), its link's keys (`permalinks.py`) and the request its readout sends are
all read from that one line, so a field added at the end of a request reaches the tab and its link with no
other edit. `View` is a tab's state as parsed values: what a link restores and the link box writes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .. import config
from ..charts import METRICS
from ..service import fields as f
from ..service import parsers
from ..service.field import Field, RequestError
from ..service.kinds import KINDS

# What only a view has. The prompt(s) a page opens on are examples, not a request's defaults.
METRIC = Field("metric", "what colours the cells", "top1_prob", parsers.choice("metric", tuple(METRICS)),
               choices=tuple(METRICS), label="Colour cells by")
START = Field("start", "the first position drawn of a long prompt (none: the last ones)", None,
              parsers.optional_whole("start", 0, 1 << 20), api=(int | None, None))
# A link's words, shown above its view (ui/notes.py): bounded text, shown as text, never stored.
TITLE = Field("title", f"the link's title, shown above its view (one line, up to {config.MAX_TITLE_CHARS} characters)",
              "", lambda raw: _one_line(parsers.text("the title", config.MAX_TITLE_CHARS, empty_ok=True)(raw)))
NOTE = Field("note", f"a note shown above the view (up to {config.MAX_NOTE_CHARS} characters; 'layer 22' or a token "
             "in backticks outlines its cells)", "", parsers.text("the note", config.MAX_NOTE_CHARS, empty_ok=True))
NOTE_FIELDS = ("title", "note")        # any tab's link may carry them (only when they are not empty)
# A generation's branches (ui/branching.py): chains of forced token ids, as their text ('3=#7042;3=#7042,9=#13'),
# read by the force field's own parser (service/parsers.py). The tab's own request is unforced (it omits force).
# A page's kept branches (`kept.py`'s recipe) are read by the same rule (`CHAINS`): at most MAX_BRANCHES chains.
CHAINS = parsers.branches(config.MAX_BRANCHES, config.MAX_FORCES, config.MAX_GENERATE_TOKENS - 1)
BRANCHES = Field("branches", "the generation's branches: for each, the steps forced and the token ids put there", "",
                 lambda raw: parsers.branches_text(CHAINS(raw)))
QUIET_WHEN_EMPTY = ("branches",)       # a link names them only when there are some

# The page's examples: what a tab shows before anyone types (a required field has no default of its own).
DEFAULT_PROMPT = "The capital of France is"
DEFAULT_COMPARE = ("The capital of France is", "The capital of Italy is")
# The intervention the Intervene tab opens on: steer the capital of France toward Rome, two thirds of the way up.
DEFAULT_WORD, DEFAULT_SPAN = "Rome", "-8"
# The Components tab opens on who wrote Paris over Rome after "The capital of France is".
DEFAULT_TARGET, DEFAULT_FOIL = "Paris", "Rome"
EXAMPLES = {"prompt": DEFAULT_PROMPT, "prompts": DEFAULT_COMPARE, "word": DEFAULT_WORD, "layer": DEFAULT_SPAN,
            "target": DEFAULT_TARGET, "foil": DEFAULT_FOIL}
# Request fields a link (and a form) names more briefly: the request field's name -> its link name.
SHORT_NAMES = {f.SKIP_PUNCTUATION.name: "punct"}
# A list a link and a form spread over numbered keys (prompt1, prompt2, ...): its name -> (stem, how many).
SPREAD = {f.PROMPTS.name: ("prompt", config.MAX_COMPARE_PROMPTS)}
# Link fields that count a text's tokens, each by the link field holding that text: what they name depends on how
# the app reads the text (BOS first or not), so a link's format version says how they counted (permalinks.py).
# `patterns` names a layer and `branches` a generation's steps: neither counts a prompt's tokens.
TOKEN_POSITIONS = {"start": "prompt", "positions": "prompt", "source_positions": "source", "position": "prompt"}


@dataclass(frozen=True)
class TabView:
    """name: the tab's id (a link's `tab=`, its elements' id prefix); kind: the request kind its readout asks;
    omits: request fields the tab does not offer (it sets them itself); extras: (field, the link name it
    follows) for what only the view has ("": at the end)."""

    name: str
    kind: str
    omits: tuple[str, ...] = ()
    extras: tuple[tuple[Field, str], ...] = ()

    def request_fields(self) -> dict[str, Field]:
        """The kind's fields this tab offers, by link name, in their published order."""
        return {SHORT_NAMES.get(x.name, x.name): x for x in KINDS[self.kind].fields() if x.name not in self.omits}

    def fields(self) -> dict[str, Field]:
        """Every field the tab's link carries, by link name: its request's, each extra after the one it follows."""
        out: dict[str, Field] = {}
        for name, field in self.request_fields().items():
            out[name] = field
            out.update({x.name: x for x, after in self.extras if after == name})
        out.update({x.name: x for x, _ in self.extras if x.name not in out})
        return out

    def input_names(self) -> list[str]:
        """The tab's inputs by name: a link field each, a spread one as its numbered boxes."""
        return [key for name in self.fields() for key in spread_keys(name)]

    def read(self, name: str, values: dict) -> Any:
        """The raw value of link field `name` among the inputs' `values` (a spread one: its filled boxes)."""
        if name in SPREAD:
            return filled(values.get(key) for key in spread_keys(name))
        return values.get(name)

    def request(self, values: dict, **fixed):
        """The request the inputs' `values` ask, read by its fields' parsers once (RequestError: one line);
        `fixed`: what the tab sets itself (a lens tab's lens)."""
        raw = {field.name: self.read(name, values) for name, field in self.request_fields().items()}
        return KINDS[self.kind].request_of({**raw, **fixed})

    def view_of(self, values: dict) -> View:
        """The View of the inputs' values mid-edit (an emptied box, a half-typed number): a value its field
        cannot read keeps the field's default. Never raises (the link follows every keystroke)."""
        fields, parsed = view_fields(), {}
        for name in self.fields():
            try:
                parsed[name] = fields[name](self.read(name, values))
            except (RequestError, TypeError, ValueError):
                continue
        return View(tab=self.name, **parsed)

    def values_of(self, view: View) -> dict[str, Any]:
        """The inputs' values that show `view`, by input name (a word list as its text box shows it)."""
        return self.shown({name: getattr(view, name) for name in self.fields()})

    def initial(self) -> dict[str, Any]:
        """The inputs' values before anyone types: the page's examples, else the fields' defaults."""
        return self.shown({name: EXAMPLES.get(name, x.default) for name, x in self.fields().items()})

    @staticmethod
    def shown(values: dict[str, Any]) -> dict[str, Any]:
        """Parsed values as the inputs show them, by input name."""
        out = {}
        for name, value in values.items():
            if name in SPREAD:
                boxes = spread_keys(name)
                out.update(zip(boxes, [*list(value)[:len(boxes)], *[""] * len(boxes)]))
            else:
                out[name] = as_text(value) if isinstance(value, tuple) else value
        return out


TAB_VIEWS: dict[str, TabView] = {v.name: v for v in (
    TabView("logit", "lens", omits=("lens",), extras=((METRIC, "targets"), (START, "raw"))),
    # The rows inside each layer (sublayers) are the logit lens's alone.
    TabView("jacobian", "lens", omits=("lens", "sublayers"), extras=((METRIC, "targets"), (START, "raw"))),
    TabView("generate", "generate", omits=("force",), extras=((BRANCHES, ""),)),
    TabView("compare", "compare", omits=("sublayers",), extras=((METRIC, "targets"),)),
    TabView("intervene", "intervene", extras=((METRIC, "targets"),)),
    TabView("components", "components"),
)}
TAB = Field("tab", "which tab the link opens", config.TABS[0], lambda raw: parsers.choice("tab", tuple(TAB_VIEWS))(raw))


def tab_fields(tab: str) -> tuple[str, ...]:
    """The link names a tab's link carries (the rest are that tab's defaults)."""
    return tuple(TAB_VIEWS[tab].fields()) if tab in TAB_VIEWS else ()


def view_fields() -> dict[str, Field]:
    """Every field a link may carry, by link name, the page's examples as defaults: the tab, each tab's
    fields (a name is read by one parser in every tab that has it), and the link's title and note."""
    out = {"tab": TAB}
    for view in TAB_VIEWS.values():
        for name, field in view.fields().items():
            seen = out.setdefault(name, replace(field, default=EXAMPLES[name], required=False)
                                  if name in EXAMPLES else field)
            if seen.parse is not field.parse:
                raise TypeError(f"the {view.name} tab reads a link's {name} unlike another tab")
    return {**out, "title": TITLE, "note": NOTE}


class View:
    """A tab's state as parsed values, by link name: `View(tab="generate", k=3).k`; a field not given is its
    default. Immutable: `view.replace(k=4)` is another view. Empty means empty: no targets."""

    __slots__ = ("_values",)

    def __init__(self, tab: str = TAB.default, **values):
        fields = view_fields()
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise TypeError(f"a view has no field {unknown}")
        defaults = {name: x.default for name, x in fields.items()}
        object.__setattr__(self, "_values", {**defaults, **values, "tab": tab})

    def __getattr__(self, name: str):
        try:
            return object.__getattribute__(self, "_values")[name]
        except KeyError:
            raise AttributeError(f"a view has no field {name!r}") from None

    def __setattr__(self, name, value):
        raise AttributeError("a view is immutable: use view.replace(...)")

    def replace(self, **changes) -> View:
        values = {**self._values, **changes}
        return View(**values)

    def __eq__(self, other) -> bool:
        return isinstance(other, View) and self._values == other._values

    def __hash__(self) -> int:
        return hash(tuple(self._values.items()))

    def __repr__(self) -> str:
        return f"View({', '.join(f'{k}={v!r}' for k, v in self._values.items())})"


def spread_keys(name: str) -> tuple[str, ...]:
    """A link field's keys: its own name, or a spread one's numbered keys (prompts: prompt1, prompt2, ...)."""
    if name not in SPREAD:
        return (name,)
    stem, n = SPREAD[name]
    return tuple(f"{stem}{i}" for i in range(1, n + 1))


def filled(boxes) -> list:
    """The boxes that hold text (the optional ones may be left empty)."""
    return [p for p in boxes if not (p is None or isinstance(p, str) and not p.strip())]


def as_text(value) -> str:
    """A parsed value as a link (or a form's text box) writes it."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):                 # short where that reads back the same number, else exact
        short = f"{value:g}"
        return short if float(short) == value else repr(value)
    if isinstance(value, tuple):
        return ", ".join(as_text(x) for x in value)
    return str(value)


def _one_line(text: str) -> str:
    if "\n" in text or "\r" in text:
        raise RequestError("the title must be one line")
    return text

"""A workshop file: what a host hands `lensapp serve --workshop FILE` (YAML).

    title: Where does the answer appear?
    tabs: [logit, jacobian, compare]          # the tabs shown, in config.TABS's names (default: all)
    record_prompts: false                     # keep the prompts people ran at /workshop (default: no; needs a login)
    settings: {auth: "host:h0st-pw,room:r00m-pw"}   # any `Config` setting but host, port and workshop; auth:
                                              # the host's login first, then the participants' (one shared is fine)
    exercises:                                # in order; each a link copied out of the app
      - title: The capital
        link: "?tab=logit&prompt=The%20capital%20of%20France%20is"     # or the whole address
        question: At which layer does Paris first become the top word?
        hint: Read the last column upward.    # optional

`load(path)` reads and checks it before anything heavy starts: every mistake is one line of the
`WorkshopError`, and `serve` exits 2 with them. A link's fields are checked later, with the same
decoder the page uses, and the words it asks for once the model's tokenizer is read (`ui/exercises.py`:
`check_links`, `check_words`). Settings given by a flag or a variable win over the file's. `auth`'s first login is the
host's, the only one that reads /workshop (server.py); a file with a login is never published to a Space
(space.py refuses it).
Nothing here stores anything: counting what was run is `service/usage.py`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

from . import config

MAX_EXERCISES = 50
MAX_TEXT = {"title": 120, "link": 8000, "question": 2000, "hint": 2000}
KEYS = {"title", "tabs", "exercises", "settings", "record_prompts"}
EXERCISE_KEYS = {"title", "link", "question", "hint"}
FIXED_SETTINGS = {"host", "port", "workshop"}          # where the app listens is the command line's


class WorkshopError(ValueError):
    """A workshop file that cannot work: one line per mistake."""


@dataclass(frozen=True)
class Exercise:
    title: str
    query: str          # the link's query, as the page's address bar would hold it
    question: str
    hint: str = ""

    @property
    def tab(self) -> str:
        return dict(parse_qsl(self.query)).get("tab", "logit")


@dataclass(frozen=True)
class Workshop:
    title: str
    tabs: tuple[str, ...]
    exercises: tuple[Exercise, ...]
    settings: dict
    record_prompts: bool = False

    def apply(self, cfg: config.Config) -> config.Config:
        """`cfg` with the file's settings where the flags and variables left the default. Prompts are kept
        only behind a login: what people type is theirs, and /workshop would show it to anyone."""
        defaults = config.Config()
        chosen = {k: v for k, v in self.settings.items() if config.value_of(cfg, k) == config.value_of(defaults, k)}
        cfg = config.replace(cfg, **chosen)
        if self.record_prompts and not cfg.secrets.auth_pairs:
            raise WorkshopError("record_prompts: true needs a login (settings: {auth: \"host:password\"} or "
                                "LENSAPP_AUTH): /workshop would show everyone's prompts to anyone")
        return cfg


def load(path: str | Path) -> Workshop:
    """Read and check a workshop file; WorkshopError lists every mistake, one per line."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise WorkshopError(f"workshop file {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise WorkshopError(f"workshop file {path}: not UTF-8 text") from None
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        line = f" (line {where.line + 1})" if where is not None else ""
        raise WorkshopError(f"workshop file {path}: not valid YAML{line}: {getattr(e, 'problem', None) or e}") from None
    mistakes: list[str] = []
    workshop = _read(data, mistakes)
    if mistakes:
        raise WorkshopError("\n".join(f"workshop file {path}: {m}" for m in mistakes))
    return workshop


def _read(data, mistakes: list[str]) -> Workshop | None:
    if not isinstance(data, dict):
        mistakes.append("it must be a mapping with title, tabs and exercises")
        return None
    for key in sorted(set(map(str, data)) - KEYS):
        mistakes.append(f"unknown key {key!r} (known: {', '.join(sorted(KEYS))})")
    title = _text(data.get("title"), "title", MAX_TEXT["title"], mistakes)
    tabs = _tabs(data.get("tabs", list(config.TABS)), mistakes)
    settings = _settings(data.get("settings") or {}, mistakes)
    record = data.get("record_prompts", False)
    if not isinstance(record, bool):
        mistakes.append(f"record_prompts must be true or false, got {record!r}")
    raw = data.get("exercises")
    if not isinstance(raw, list) or not raw:
        mistakes.append("exercises must be a list of at least one {title, link, question, hint}")
        raw = []
    elif len(raw) > MAX_EXERCISES:
        mistakes.append(f"at most {MAX_EXERCISES} exercises, got {len(raw)}")
    exercises = [_exercise(i, ex, tabs, mistakes) for i, ex in enumerate(raw[:MAX_EXERCISES], 1)]
    if mistakes:
        return None
    return Workshop(title, tabs, tuple(exercises), settings, record)


def _text(value, what: str, limit: int, mistakes: list[str], required: bool = True) -> str:
    if value is None and not required:
        return ""
    if not isinstance(value, str) or not value.strip():
        mistakes.append(f"{what} must be a non-empty text" + (f", got {value!r}" if value is not None else ""))
        return ""
    if len(value) > limit:
        mistakes.append(f"{what} is {len(value)} characters; at most {limit}")
    return value.strip()


def _tabs(value, mistakes: list[str]) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(t, str) for t in value):
        mistakes.append(f"tabs must be a list of tab names ({', '.join(config.TABS)})")
        return config.TABS
    unknown = [t for t in value if t not in config.TABS]
    if unknown:
        mistakes.append(f"unknown tab(s) {', '.join(map(repr, unknown))} (known: {', '.join(config.TABS)})")
    return tuple(t for t in config.TABS if t in value)          # the app's order


def _settings(value, mistakes: list[str]) -> dict:
    if not isinstance(value, dict):
        mistakes.append("settings must be a mapping of setting: value")
        return {}
    known = {f.name: f for f in config.SETTING_FIELDS}
    out = {}
    for name, v in value.items():
        field = known.get(str(name))
        if field is None or name in FIXED_SETTINGS:
            why = "is the command line's" if name in FIXED_SETTINGS else "is not a setting (see docs/hosting.md)"
            mistakes.append(f"settings: {name!r} {why}")
            continue
        kind = type(field.default)
        if kind is float and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        if type(v) is not kind:
            mistakes.append(f"settings: {name} must be {kind.__name__}, got {v!r}")
            continue
        out[name] = v
    try:
        config.replace(config.Config(), **out)
    except config.ConfigError as e:
        mistakes.append(f"settings: {e}")
    return out


def _exercise(i: int, ex, tabs: tuple[str, ...], mistakes: list[str]) -> Exercise | None:
    where = f"exercise {i}"
    if not isinstance(ex, dict):
        mistakes.append(f"{where} must be a mapping with title, link, question (and hint)")
        return None
    for key in sorted(set(map(str, ex)) - EXERCISE_KEYS):
        mistakes.append(f"{where}: unknown key {key!r} (known: {', '.join(sorted(EXERCISE_KEYS))})")
    title = _text(ex.get("title"), f"{where}: title", MAX_TEXT["title"], mistakes)
    link = _text(ex.get("link"), f"{where}: link", MAX_TEXT["link"], mistakes)
    question = _text(ex.get("question"), f"{where}: question", MAX_TEXT["question"], mistakes)
    hint = _text(ex.get("hint"), f"{where}: hint", MAX_TEXT["hint"], mistakes, required=False)
    query = link_query(link)
    if link and query is None:
        mistakes.append(f"{where}: link must be an address of this app or its query (?tab=...), got {link[:80]!r}")
        return None
    exercise = Exercise(title, query or "", question, hint)
    if link and exercise.tab not in tabs:
        mistakes.append(f"{where}: its link opens the {exercise.tab!r} tab, which the workshop does not show "
                        f"(tabs: {', '.join(tabs)})")
    return exercise


def link_query(link: str) -> str | None:
    """The query of a link copied out of the app (a whole address, `?tab=...` or `tab=...`), or None."""
    link = link.strip()
    if "://" in link:
        parts = urlsplit(link)
        return parts.query or None
    query = link[1:] if link.startswith("?") else link
    return query if "=" in query and not any(c.isspace() for c in query) else None

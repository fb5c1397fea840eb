"""Evaluation items: the shipped sets and any file of the published form, read and checked once.

The published form is `{"items": [{"name", "prompt", "target", "intermediates"}, ...]}`: a prompt whose answer
(`target`) needs an unspoken intermediate (`intermediates`: its names, a list of words). An item may carry a
`split` (`dev` or `heldout`); one without is `heldout` (a file made for reporting). Other keys are ignored. The
shipped sets live in `lensapp/assets/evaluations/` (its README says where they came from); the API and the page
evaluate only those, and a file is the command line's (the host's) to give.

Every failure is one `RequestError` line naming the file, the item and what is wrong with it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from ..config import MAX_PROMPT_CHARS, MAX_TARGET_CHARS, PACKAGE_DIR
from .field import RequestError, clip, show
from .parsers import check_text

EVALUATIONS = PACKAGE_DIR / "assets" / "evaluations"
SHIPPED = {"two_hop": EVALUATIONS / "two_hop.json"}
SPLITS = ("heldout", "dev", "all")
MAX_ITEMS = 2000                 # items in one file (the command line's: each is one forward)
MAX_FILE_BYTES = 8 << 20
MAX_INTERMEDIATES = 8            # names of one intermediate
MAX_NAME_CHARS = 200


@dataclass(frozen=True)
class EvalItem:
    """One item: the prompt, the word it should end in, and the unspoken intermediate's names."""

    name: str
    prompt: str
    target: str
    intermediates: tuple[str, ...]
    split: str = "heldout"


@dataclass(frozen=True)
class ItemSet:
    """Items read from one source: its label (a shipped set's name, or a file's name), and a digest of its
    bytes (a cache key's part: an edited file is never served an older answer)."""

    label: str
    digest: str
    items: tuple[EvalItem, ...]
    shipped: bool

    def split(self, which: str) -> tuple[EvalItem, ...]:
        """The items of one split ('all': every item); RequestError when none is left."""
        if which not in SPLITS:
            raise RequestError(f"split must be one of {', '.join(SPLITS)}; got {show(which)}")
        chosen = self.items if which == "all" else tuple(x for x in self.items if x.split == which)
        if not chosen:
            raise RequestError(f"{self.label} has no {which} items")
        return chosen


def item_set(source: str, files: bool = False) -> ItemSet:
    """A shipped set by name, or (with `files`: the command line) a file of the published form."""
    if source in SHIPPED:
        return read(SHIPPED[source], label=source, shipped=True)
    if not files:
        raise RequestError(f"items must be one of the shipped sets ({', '.join(SHIPPED)}); got {show(source)} "
                           "(an items file is for the command line: lensapp evaluate --items FILE)")
    return read(Path(source))


def read(path: Path, label: str | None = None, shipped: bool = False) -> ItemSet:
    """The items of a file of the published form, checked; RequestError (one line) otherwise."""
    label = label or path.name
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise RequestError(f"items file {label}: {size:,} bytes; the limit is {MAX_FILE_BYTES:,}")
        data = path.read_bytes()
    except OSError as e:
        raise RequestError(f"items file {label}: cannot be read ({e.strerror or type(e).__name__})") from None
    return ItemSet(label, hashlib.sha256(data).hexdigest()[:16], parse(data, label), shipped)


def parse(data: bytes | str, label: str) -> tuple[EvalItem, ...]:
    """Items from the text of a file of the published form."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as e:      # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise RequestError(f"items file {label}: not JSON ({clip(str(e).splitlines()[0] if str(e) else '', 80)})"
                           ) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("items"), list):
        raise RequestError(f"items file {label}: expected an object with a list under \"items\"")
    rows = doc["items"]
    if not rows:
        raise RequestError(f"items file {label}: \"items\" is empty")
    if len(rows) > MAX_ITEMS:
        raise RequestError(f"items file {label}: {len(rows):,} items; the limit is {MAX_ITEMS:,}")
    items = tuple(_item(row, i, label) for i, row in enumerate(rows))
    seen: set[str] = set()
    for item in items:
        if item.name in seen:
            raise RequestError(f"items file {label}: two items are named {show(item.name)}")
        seen.add(item.name)
    return items


def _item(row, i: int, label: str) -> EvalItem:
    where = f"items file {label}: item {i}"
    if not isinstance(row, dict):
        raise RequestError(f"{where} is not an object")
    if isinstance(row.get("name"), str):
        where += f" ({clip(row['name'], 40)!r})"
    name = _text(row, "name", MAX_NAME_CHARS, where)
    prompt = _text(row, "prompt", MAX_PROMPT_CHARS, where)
    target = _text(row, "target", MAX_TARGET_CHARS, where)
    names = row.get("intermediates")
    if isinstance(names, str):
        names = [names]
    if not isinstance(names, list) or not names or len(names) > MAX_INTERMEDIATES \
            or not all(isinstance(w, str) and w.strip() and len(w) <= MAX_TARGET_CHARS for w in names):
        raise RequestError(f"{where}: \"intermediates\" must be a list of 1 to {MAX_INTERMEDIATES} words "
                           f"(each at most {MAX_TARGET_CHARS} characters)")
    for w in names:
        check_text(w, f"{where}: an intermediate")
    split = row.get("split", "heldout")
    if split not in SPLITS[:2]:
        raise RequestError(f"{where}: \"split\" must be dev or heldout; got {show(split)}")
    return EvalItem(name, prompt, target, tuple(w.strip() for w in names), split)


def _text(row: dict, key: str, limit: int, where: str) -> str:
    value = row.get(key)
    if not isinstance(value, str) or not value.strip():
        raise RequestError(f"{where}: \"{key}\" must be a non-empty string")
    if len(value) > limit:
        raise RequestError(f"{where}: \"{key}\" has {len(value):,} characters; the limit is {limit:,}")
    check_text(value, f"{where}: \"{key}\"")
    return value.strip() if key != "prompt" else value

"""What a request field is: one declaration that every surface reads.

A `Field` names a value a caller may give (`k`, `layers`, `prompt`), its default, the one parser that reads
it from whatever a surface hands over (text from a link or the command line, a JSON value from the API, a
component's value from a form), and how it appears where it appears: its help, its form label, its choices,
its command-line flag, its API type. The request classes (`requests.py`) list their fields in their
published order; the API's parameters, the CLI's arguments, a link's keys and a tab's inputs are all made
from those lists (`kinds.py` says which request each surface carries).

A parser returns the field's value or raises `RequestError` with one line that names the field. `None`
means "not given": the field's default (a required field says it was not given).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any, Callable


class RequestError(ValueError):
    """The caller's input cannot be served; the message says why, in one line."""


REQUIRED = object()          # an API parameter with no default (the caller must give it)


@dataclass(frozen=True)
class Field:
    """One request field.

    flag: its command-line flag ("" where it is positional); cli: False where another argument sets it (the
      intervention's kind, set by --steer, --ablate or --patch-from: `selects`).
    selects: {value: (flag, field name)}: on the command line, one of these flags gives this field `value` and
      the named field the flag's argument.
    choices: the values a choice field takes, in the order a form offers them.
    label: a form's label for it (default: its help).
    api: (type hint, default) where the API shows it otherwise than its value's type and default.
    """

    name: str
    help: str
    default: Any
    parse: Callable[[Any], Any]
    flag: str = ""
    required: bool = False
    choices: tuple = ()
    label: str = ""
    api: tuple | None = None
    cli: bool = True
    selects: dict | None = dataclass_field(default=None, hash=False, compare=False)

    def __call__(self, raw) -> Any:
        if raw is None:
            if self.required:
                raise RequestError(f"no {self.name} given")
            raw = self.default
            if raw is None:
                return None
        return self.parse(raw)

    def declared(self):
        """This field as a dataclass field of a request (its default, and itself in the metadata)."""
        default = self.default
        if isinstance(default, (list, dict)):
            return dataclass_field(default_factory=lambda: type(default)(default), metadata={"field": self})
        return dataclass_field(default=default, metadata={"field": self})

    @property
    def api_form(self) -> tuple[Any, Any]:
        """(type hint, default) of this field as an API parameter (`REQUIRED`: none)."""
        return self.api if self.api is not None else (type(self.default), self.default)


def fields_of(cls) -> dict[str, Field]:
    """A request class's fields, in their declared (published) order."""
    return {f.name: f.metadata["field"] for f in cls.__dataclass_fields__.values() if "field" in f.metadata}


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

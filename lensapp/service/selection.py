"""Layers or positions as a caller names them, parsed once: 'all', 'last', '3', '0,5,-1', '10-20'.

One grammar for every selection of things counted from 0 (a model's layers, a prompt's positions):
comma-separated parts, each `all`, `last`, a number or a range `A-B`, negative numbers counting from
the end. A `Selection` is its text (a `str`: what a link, the JSON and a cache key carry, as the caller
wrote it) with its parts read; `resolve(n)` turns it into sorted indices of an n-long thing, checking
each against it, when the n is known (the model, the prompt).
"""

from __future__ import annotations

import re

from .field import RequestError, show

_PART = re.compile(r"all|last|(-?\d+)|(-?\d+)-(-?\d+)")


class Selection(str):
    """A selection as text, with its parts: "all", "last", an int, or an (int, int) range."""

    parts: tuple

    def __new__(cls, text: str, max_chars: int = 200):
        if isinstance(text, Selection):
            return text
        if not isinstance(text, str):
            raise RequestError(f"expected text like 'all', '0,5,-1' or '10-20'; got {type(text).__name__}")
        if len(text) > max_chars:
            raise RequestError(f"the selection has {len(text)} characters; the limit is {max_chars}")
        stripped = text.strip() or "all"
        parts = [p for p in stripped.lower().replace(" ", "").split(",") if p]
        read = [_part(p) for p in parts]
        if not read or None in read:
            raise RequestError(f"expected 'all', numbers like 0,5,-1 or a range like 10-20; got {show(stripped)}")
        self = super().__new__(cls, stripped)
        self.parts = tuple(read)
        return self

    def __reduce__(self):                        # it travels (a cache key, a pickled request) as its text
        return Selection, (str(self),)

    @property
    def is_all(self) -> bool:
        return "all" in self.parts

    def resolve(self, n: int, noun: str = "layer", allowed: list[int] | None = None) -> list[int]:
        """Sorted unique indices of an n-long thing (among `allowed` when given); RequestError naming `noun`."""
        pool = list(range(n)) if allowed is None else sorted(allowed)
        if self.is_all:
            return pool
        chosen: set[int] = set()
        for part in self.parts:
            if part == "last":
                chosen.add(n - 1)
            elif isinstance(part, tuple):
                lo, hi = _index(part[0], n, noun), _index(part[1], n, noun)
                if lo > hi:
                    raise RequestError(f"{noun} range {part[0]}-{part[1]} runs backwards")
                chosen.update(range(lo, hi + 1))
            else:
                chosen.add(_index(part, n, noun))
        outside = sorted(chosen - set(pool))
        if outside:
            what = f"0..{n - 1}" if allowed is None else f"the Jacobian lens's layers {span(pool)}"
            raise RequestError(f"{noun}s {span(outside)} are not in {what}")
        return sorted(chosen)


def _part(text: str):
    m = _PART.fullmatch(text)
    if m is None:
        return None
    if m[1] is not None:
        return int(m[1])
    if m[2] is not None:
        return int(m[2]), int(m[3])
    return m[0]


def _index(i: int, n: int, noun: str) -> int:
    where = f"this {n}-layer model" if noun == "layer" else f"this {n}-token prompt"
    return index(i, n, f"{noun} {i} is outside {where} (0..{n - 1})")


def from_end(i: int, n: int) -> int:
    """The one rule for an index of an n-long thing (layers, positions): counted from 0, a negative one from the
    end (-1: the last). Not checked: `index` checks."""
    return i + n if i < 0 else i


def index(i: int, n: int, outside: str) -> int:
    """`from_end(i, n)`, or RequestError(`outside`) when that is not in 0..n-1."""
    j = from_end(i, n)
    if not 0 <= j < n:
        raise RequestError(outside)
    return j


def span(indices: list[int]) -> str:
    """[3, 4, 5, 6] -> '3..6'; anything else as a comma list."""
    if len(indices) > 2 and indices == list(range(indices[0], indices[-1] + 1)):
        return f"{indices[0]}..{indices[-1]}"
    return ", ".join(map(str, indices))

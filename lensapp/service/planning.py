"""From a validated request to the engine's `LensSpec`s: layers, lenses, targets, continuations, cost.

Pure functions of token ids and layer numbers (no model): which layers a lens may read (the
Jacobian lens only where it has a J), which residuals the backend must read, which multi-token
targets get a whole-continuation score, and the chat readout's default layer. What a request costs is
`cost.py`'s.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from ..config import MAX_CONTINUATION_TOKENS
from ..engine.protocol import Continuation, LensSpec
from .fields import RequestError, layers

NO_JLENS = "no Jacobian lens is loaded (start with --jlens PATH or HUB_REPO:FILE)"
_RANGE = re.compile(r"(-?\d+)-(-?\d+)")


def parse_layers(text: str, n_layers: int, allowed: list[int] | None = None) -> list[int]:
    """'all' | 'last' | '3' | '0,5,-1' | '10-20' -> sorted unique layer indices of an n_layers model (negative
    counts from the end), among `allowed` when given; RequestError otherwise."""
    return parse_indices(text, n_layers, "layer", allowed)


def parse_indices(text: str, n: int, noun: str, allowed: list[int] | None = None) -> list[int]:
    """The same selection of `n` things (layers of a model, positions of a prompt), named by `noun`."""
    text = layers(text).lower()
    pool = list(range(n)) if allowed is None else sorted(allowed)
    if text == "all":
        return pool
    chosen: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if part == "last":
            chosen.add(n - 1)
        elif m := _RANGE.fullmatch(part):
            lo, hi = _index(int(m[1]), n, noun), _index(int(m[2]), n, noun)
            if lo > hi:
                raise RequestError(f"{noun} range {part!r} runs backwards")
            chosen.update(range(lo, hi + 1))
        elif part:
            chosen.add(_index(int(part), n, noun))
    if not chosen:
        raise RequestError(f"no {noun}s selected")
    outside = sorted(chosen - set(pool))
    if outside:
        what = f"0..{n - 1}" if allowed is None else f"the Jacobian lens's layers {span(pool)}"
        raise RequestError(f"{noun}s {span(outside)} are not in {what}")
    return sorted(chosen)


def _index(i: int, n: int, noun: str) -> int:
    j = i + n if i < 0 else i
    if not 0 <= j < n:
        where = f"this {n}-layer model" if noun == "layer" else f"this {n}-token prompt"
        raise RequestError(f"{noun} {i} is outside {where} (0..{n - 1})")
    return j


def span(layers: list[int]) -> str:
    """[3, 4, 5, 6] -> '3..6'; anything else as a comma list."""
    if len(layers) > 2 and layers == list(range(layers[0], layers[-1] + 1)):
        return f"{layers[0]}..{layers[-1]}"
    return ", ".join(map(str, layers))


def check_prompt_count(n: int, max_prompts: int) -> None:
    if n > max_prompts:
        raise RequestError(f"at most {max_prompts} prompts at once; got {n}")


def lens_layers(text: str, lenses: tuple[str, ...], n_layers: int, jlens_layers: list[int]) -> list[int]:
    """The layers `text` selects; with the Jacobian lens, only among those it has (the last layer reads J = I)."""
    if "jacobian" in lenses:
        if not jlens_layers:
            raise RequestError(NO_JLENS)
        return parse_layers(text, n_layers, allowed=jlens_layers)
    return parse_layers(text, n_layers)


def lens_spec(ids: list[int], layers: list[int], k: int, lenses: tuple[str, ...], n_layers: int,
              jlens_layers: list[int], target_ids: list[list[int]] = (), raw: bool = False) -> LensSpec:
    """One prompt's spec. target_ids: each target's tokens; its first token is scored at every cell, and a
    target of 2..MAX_CONTINUATION_TOKENS tokens is also read whole, on the prompt continued by it."""
    read = sorted(set(layers) | {n_layers - 1})
    jrows = tuple(jlens_layers.index(layer) for layer in layers) if "jacobian" in lenses else None
    conts = tuple(Continuation(input_ids=tuple(ids) + tuple(t[:-1]), start=len(ids) - 1, target_ids=tuple(t))
                  for t in target_ids if 1 < len(t) <= MAX_CONTINUATION_TOKENS)
    return LensSpec(input_ids=tuple(ids), read_layers=tuple(read), rows=tuple(read.index(layer) for layer in layers),
                    k=k, lenses=tuple(lenses), jlens_rows=jrows, target_ids=tuple(t[0] for t in target_ids),
                    raw=raw, continuations=conts)


def continuation_index(target_ids: list[list[int]]) -> list[int | None]:
    """For each target, the index of its continuation in `lens_spec`'s order (None: scored by its first token)."""
    out, n = [], 0
    for t in target_ids:
        if 1 < len(t) <= MAX_CONTINUATION_TOKENS:
            out.append(n)
            n += 1
        else:
            out.append(None)
    return out


def default_chat_layer(pool: list[int], n_layers: int) -> int:
    """The chat readout's layer when none is asked for: the one nearest two thirds of the depth."""
    return min(pool, key=lambda x: abs(x - 2 * (n_layers - 1) / 3))


class JLensSelection(NamedTuple):
    layers: list[int]          # the selected layers that have a J
    missing: list[int]         # layers named one by one that have none


def jlens_subset(text: str, n_layers: int, jlens_layers: list[int]) -> JLensSelection:
    """The layers `text` selects that have a J (so a range means the J layers inside it), and the ones it
    named one by one that have none (for a warning). RequestError when none of them has a J."""
    wanted = parse_layers(text or "all", n_layers)
    have = [layer for layer in wanted if layer in jlens_layers]
    if not have:
        raise RequestError(f"none of layers {text!r} has a Jacobian lens; it covers {span(jlens_layers)}")
    singles = [parse_layers(part, n_layers) for part in (text or "").split(",") if part.strip().lstrip("-").isdigit()]
    return JLensSelection(have, sorted({layer for s in singles for layer in s} - set(jlens_layers)))

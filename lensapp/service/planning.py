"""From a validated request to the engine's `LensSpec`s: layers, lenses, targets, continuations, cost.

Pure functions of token ids and layer numbers (no model): which layers a lens may read (the
Jacobian lens only where it has a J), which residuals the backend must read, which multi-token
targets get a whole-continuation score, and the chat readout's default layer. What a request costs is
`cost.py`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from ..config import MAX_CONTINUATION_TOKENS
from ..engine.run.protocol import Continuation, LensSpec
from ..lens_kinds import reads_jlens
from ..results import Target
from .cost import Cost
from .field import RequestError
from .selection import Selection, span

NO_JLENS = "no Jacobian lens is loaded (start with --jlens PATH or HUB_REPO:FILE)"


@dataclass
class Plan:
    """A lens request or a generation resolved into the engine's terms (the same for a check and a run)."""

    lenses: tuple[str, ...]
    layers: list[int]
    ids: list[list[int]]
    specs: list[LensSpec]
    cost: Cost
    targets: list[list[Target]] = field(default_factory=list)             # per prompt
    continuation_of: list[list[int | None]] = field(default_factory=list)  # per prompt


def check_prompt_count(n: int, max_prompts: int) -> None:
    if n > max_prompts:
        raise RequestError(f"at most {max_prompts} prompts at once; got {n}")


def lens_layers(selection: Selection, lenses: tuple[str, ...], n_layers: int, jlens_layers: list[int]) -> list[int]:
    """The layers a selection names; with a lens that reads through J, only among those it has (the last layer
    reads J = I)."""
    if reads_jlens(lenses):
        if not jlens_layers:
            raise RequestError(NO_JLENS)
        return selection.resolve(n_layers, allowed=jlens_layers)
    return selection.resolve(n_layers)


def lens_spec(ids: list[int], layers: list[int], k: int, lenses: tuple[str, ...], n_layers: int,
              jlens_layers: list[int], target_ids: list[list[int]] = (), raw: bool = False) -> LensSpec:
    """One prompt's spec. target_ids: each target's tokens; its first token is scored at every cell, and a
    target of 2..MAX_CONTINUATION_TOKENS tokens is also read whole, on the prompt continued by it."""
    read = sorted(set(layers) | {n_layers - 1})
    jrows = tuple(jlens_layers.index(layer) for layer in layers) if reads_jlens(lenses) else None
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


def jlens_subset(selection: Selection, n_layers: int, jlens_layers: list[int]) -> JLensSelection:
    """The layers a selection names that have a J (so a range means the J layers inside it), and the ones it
    named one by one that have none (for a warning). RequestError when none of them has a J."""
    have = [layer for layer in selection.resolve(n_layers) if layer in jlens_layers]
    if not have:
        raise RequestError(f"none of layers {str(selection)!r} has a Jacobian lens; it covers {span(jlens_layers)}")
    singles = {Selection(str(part)).resolve(n_layers)[0] for part in selection.parts if isinstance(part, int)}
    return JLensSelection(have, sorted(singles - set(jlens_layers)))

"""Patch: copy a source prompt's residual stream at some positions into the target prompt's, at one layer at a
time over a span: a sweep over layers, one readout per layer.

The source is read once (its streams kept at every layer of the span, at its positions), and each readout
after replaces the target's rows at those positions with the source's, at that layer alone. What it tells
apart: cells that *carry* the answer (patched in, the target's answer moves toward the source's: the word's
probability rises, the target's own answer falls) from cells that do not (nothing moves), and the layers
where that information lives (where along the sweep the answer flips).

The rules: a source prompt is needed; at most MAX_SWEEP layers at once; the source's positions are named,
or as many as the target's aligned at the end (refused when the source is too short for that); as many
source positions as target positions.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ...config import MAX_SWEEP
from ...engine.run.edit import Edit
from ...results import PatchDone
from .. import cost
from ..field import RequestError
from ..requests import InterveneRequest
from .kind import Changes, EngineCalls, PlanInputs, Planned, Reading, prompt_positions
from .registry import intervention


@dataclass(frozen=True)
class PatchPlan:
    """source_ids: the source prompt's ids; positions[i]: the target position that source_positions[i] is copied
    into; word: the first target (None: none)."""

    source: str
    source_ids: tuple[int, ...]
    positions: tuple[int, ...]
    source_positions: tuple[int, ...]
    word: str | None
    n_changes: int
    extra: cost.Cost
    words: tuple[str, ...] = ()


def cells(ids: tuple[int, ...], source_ids: tuple[int, ...], positions: tuple[int, ...] | None,
          source_selection) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the target positions, the source position each is copied from): the target's positions (None: all); the
    source's as named, or as many as the target's aligned at the end."""
    positions = positions or tuple(range(len(ids)))
    if source_selection:
        sources = prompt_positions(source_selection, len(source_ids)) or tuple(range(len(source_ids)))
    else:
        shift = len(source_ids) - len(ids)
        sources = tuple(p + shift for p in positions)
        if any(not 0 <= p < len(source_ids) for p in sources):
            raise RequestError("the source prompt is too short to align these positions at its end; "
                               "name the source positions")
    if len(sources) != len(positions):
        raise RequestError(f"{len(positions)} target positions but {len(sources)} source positions")
    return positions, sources


def edits(kept: torch.Tensor, span: tuple[int, ...], positions: tuple[int, ...]) -> list[list[Edit]]:
    """kept [layers, positions, d_model] (the source's streams at `span`) -> per layer, one edit replacing the
    target's rows at `positions` at that layer alone."""
    return [[Edit(layer, "replace", kept[i].float(), positions)] for i, layer in enumerate(span)]


@intervention("patch")
class Patch:
    def plan(self, req: InterveneRequest, reading: Reading, inputs: PlanInputs) -> PatchPlan:
        if len(reading.span) > MAX_SWEEP:
            raise RequestError(f"a patch sweeps at most {MAX_SWEEP} layers at once; got {len(reading.span)}")
        if not req.source.strip():
            raise RequestError("patching needs a source prompt to copy cells from")
        source_ids = tuple(inputs.prompts.ids(req.source, req.chat))
        positions, sources = cells(reading.ids, source_ids, reading.positions, req.source_positions)
        return PatchPlan(req.source, source_ids, positions, sources, req.targets[0] if req.targets else None,
                         n_changes=len(reading.span),
                         extra=cost.forward(len(source_ids), len(reading.layers), len(reading.lenses)))

    def carry_out(self, planned: Planned[PatchPlan], run: EngineCalls) -> Changes:
        change, span = planned.change, planned.reading.span
        spec = dataclasses.replace(planned.base, input_ids=change.source_ids, target_ids=(), continuations=(),
                                   keep_layers=span, keep_positions=change.source_positions)
        kept, source = run.read_source(spec, change.source)
        done = PatchDone(**planned.described(), word=change.word, source=change.source,
                         target_positions=change.positions, source_positions=change.source_positions)
        return Changes([f"layer {layer}" for layer in span], [float(layer) for layer in span],
                       edits(kept, span, change.positions), done, source)

"""Ablate: at every layer of a span, remove the component of the residual stream along a word's direction
(`project`), or set it to its mean over a reference text (`mean`); one readout after.

The direction is the word's logit-lens or Jacobian-lens direction (minus a from-word's, when given;
`directions.py`), never a fitted one. What it tells apart: a direction that *carries* the answer (the word's
probability at the output drops once it is gone) from one that is only read there (the answer stands); the
mean ablation keeps the stream at a typical value rather than at zero, so a drop is not just the stream
leaving the distribution the model saw. The means are taken over the reference's positions but the first
(an attention sink), by default over the paragraph the typical norms are measured on (`norms.py`).

The rules: a word is needed; a fitted direction is refused; a Jacobian direction needs a J at every layer of
the span.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ... import interventions as iv
from ...engine.run.edit import Edit
from ...results import AblateDone
from .. import cost
from ..field import RequestError
from ..requests import InterveneRequest
from ..selection import span as span_text
from .kind import Changes, EngineCalls, PlanInputs, Planned, Reading
from .norms import REFERENCE_TEXT
from .registry import intervention


@dataclass(frozen=True)
class AblatePlan:
    """word_ids: the word's first token, then the from-word's, each as the model would write it after the prompt
    (prompts.py: `word`); reference_ids: a mean ablation's reference text
    (empty for project); positions: the prompt positions changed (None: all)."""

    word: str
    word_ids: tuple[int, ...]
    from_word: str
    direction: str
    ablation: str
    reference: str
    reference_ids: tuple[int, ...]
    positions: tuple[int, ...] | None
    n_changes: int = 1
    extra: cost.Cost = cost.NOTHING

    @property
    def words(self) -> tuple[str, ...]:
        return (self.word,)


def reference_means(kept: torch.Tensor, span: tuple[int, ...], directions: dict[int, torch.Tensor]) -> dict[int, float]:
    """kept [layers, positions, d_model] (the reference's streams at `span`) -> {layer: the mean component along
    the layer's direction over the positions but the first}."""
    kept = kept.float()
    return {layer: float((kept[i, 1:] @ iv.unit(directions[layer])).mean()) for i, layer in enumerate(span)}


def edits(directions: dict[int, torch.Tensor], positions: tuple[int, ...] | None,
          means: dict[int, float] | None = None) -> list[Edit]:
    """At each layer: project the direction out, or (with `means`) set the component along it to the mean."""
    if means is None:
        return [Edit(layer, "project_out", d, positions) for layer, d in directions.items()]
    return [Edit(layer, "set_component", d, positions, value=means[layer]) for layer, d in directions.items()]


@intervention("ablate")
class Ablate:
    def plan(self, req: InterveneRequest, reading: Reading, inputs: PlanInputs) -> AblatePlan:
        if not req.word.strip():
            raise RequestError("ablation needs a word")
        if req.direction == "fitted":
            raise RequestError("ablate along a word's logit or jacobian direction, not a fitted one")
        if req.direction == "jacobian":
            for layer in reading.span:
                inputs.jacobians.at(layer)                 # RequestError now, not after a minute of work
        words = [w for w in (req.word, req.from_word) if w.strip()]
        word_ids = tuple(t.token_ids[0] for t in inputs.prompts.words(words, reading.ids))
        reference, reference_ids, extra = "", (), cost.NOTHING
        if req.ablation == "mean":
            reference = req.reference or REFERENCE_TEXT
            reference_ids = tuple(inputs.prompts.ids(reference))
            extra = cost.forward(len(reference_ids), 1, 1)
        return AblatePlan(req.word, word_ids, req.from_word, req.direction, req.ablation, reference, reference_ids,
                          reading.positions, extra=extra)

    def carry_out(self, planned: Planned[AblatePlan], run: EngineCalls) -> Changes:
        change, span = planned.change, planned.reading.span
        directions = {layer: run.direction(change.word_ids, layer, change.direction) for layer in span}
        means = None
        if change.ablation == "mean":
            means = reference_means(run.kept_streams(change.reference_ids, span), span, directions)
        where = f"layer {span[0]}" if len(span) == 1 else f"layers {span_text(list(span))}"
        done = AblateDone(**planned.described(), word=change.word, from_word=change.from_word,
                          direction=change.direction, ablation=change.ablation,
                          reference=change.reference if means is not None else None, means=means)
        return Changes([f"{change.ablation} {where}"], [], [edits(directions, change.positions, means)], done)

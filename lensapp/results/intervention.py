"""An intervention's readouts: the prompt read before, and again after each change (a steering strength, or a
layer of a patch sweep), with the change described and, when asked, the text generated before and after.

`before` and every `after` are `LensResult`s over the same layers and positions, so any chart or table of
one prompt works on each, and `difference` compares them cell by cell. The JSON is the CLI's
`lensapp intervene --json`: {"before": <lens --json>, "after": [<lens --json>, ...], "intervention": {...},
"dose_response": [...], "generated": {...}}.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .export import dumps, round_floats
from .lens import LensResult


@dataclass
class InterventionResult:
    """before: the plain readout; after[i]: the readout with change i (labels[i] names it: "alpha 0.4", "layer
    20"); intervention: what was done, as plain JSON values (kind, word, direction, layers, positions, the
    vector's size, the layer's typical residual norm); source: a patch's source prompt, read the same way;
    generated_before / generated_after[i]: the text generated without / with change i ("" when none was
    asked for)."""

    before: LensResult
    after: list[LensResult]
    labels: list[str]
    intervention: dict
    sweep: list[float] = field(default_factory=list)   # the swept value of each change (alpha, or layer)
    source: LensResult | None = None
    generated_before: str = ""
    generated_after: list[str] = field(default_factory=list)

    def __post_init__(self):
        if len(self.after) != len(self.labels) or (self.sweep and len(self.sweep) != len(self.after)):
            raise ValueError(f"{len(self.after)} readouts after, {len(self.labels)} labels, {len(self.sweep)} sweep")
        for r in self.after:
            if r.layers != self.before.layers or r.input_ids != self.before.input_ids or set(r.lenses) != set(
                    self.before.lenses):
                raise ValueError("every readout after must cover the readout before's layers, positions and lenses")

    @property
    def word(self) -> str | None:
        """The target the intervention is about (the steered or ablated word; a patch: the first target)."""
        targets = next(iter(self.before.lenses.values())).targets
        return targets[0].text if targets else None

    def final_probability(self, result: LensResult, target: int = 0) -> tuple[float, int]:
        """The model's own probability and rank of target `target` at the last position (the last layer)."""
        scores = next(iter(result.lenses.values())).targets[target]
        return float(scores.probs[-1, -1]), int(scores.ranks[-1, -1])

    def dose_response(self) -> pd.DataFrame:
        """A row per change: its label, swept value, and the word's final probability and rank (before: row 0)."""
        if self.word is None:
            return pd.DataFrame(columns=["change", "value", "prob", "rank"])
        rows = [("before", None, *self.final_probability(self.before))]
        rows += [(label, value, *self.final_probability(r))
                 for label, value, r in zip(self.labels, self.sweep or [None] * len(self.after), self.after)]
        return pd.DataFrame(rows, columns=["change", "value", "prob", "rank"])

    def difference(self, index: int, lens: str) -> np.ndarray:
        """[L, P] change in the word's probability (or, with no word, in top-1 probability) after change `index`."""
        a, b = self.before.lenses[lens], self.after[index].lenses[lens]
        if a.targets:
            return b.targets[0].probs - a.targets[0].probs
        return b.top_probs[..., 0] - a.top_probs[..., 0]

    def to_json(self) -> dict:
        out = {"before": self.before.to_json(), "after": [r.to_json() for r in self.after],
               "labels": self.labels, "intervention": self.intervention}
        if self.word is not None:
            # the row before has no swept value: null (pandas holds it as NaN, which is not JSON)
            out["dose_response"] = [{"change": c, "value": None if pd.isna(v) else v, "prob": round_floats(p),
                                     "rank": int(k)} for c, v, p, k in self.dose_response().itertuples(index=False)]
        if self.source is not None:
            out["source"] = self.source.to_json()
        if self.generated_after:
            out["generated"] = {"before": self.generated_before, "after": self.generated_after}
        return out

    def to_csv(self) -> str:
        frames = [self.before.long_frame().assign(readout="before")]
        frames += [r.long_frame().assign(readout=label) for label, r in zip(self.labels, self.after)]
        df = pd.concat(frames, ignore_index=True)
        return df[["readout"] + [c for c in df.columns if c != "readout"]].to_csv(index=False)

    def dumps(self) -> str:
        return dumps(self)

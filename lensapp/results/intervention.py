"""An intervention's readouts: the prompt read before, and again after each change (a steering strength, or a
layer of a patch sweep), with what was done and, when asked, the text generated before and after.

`before` and every `after` are `LensResult`s over the same layers and positions, so any chart or table of
one prompt works on each, and `difference` compares them cell by cell. What was done is typed, one class per
kind (`SteerDone`, `AblateDone`, `PatchDone`, each an `InterventionDone`): the tab, "Show the code", the CLI
and the JSON all read it. The JSON is the CLI's `lensapp intervene --json`: {"before": <lens --json>,
"after": [<lens --json>, ...], "intervention": {...}, "dose_response": [...], "generated": {...}}; a layer
keyed by its number has a string key (Gradio's orjson refuses int keys).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import pandas as pd

from .export import dumps, round_floats
from .lens import LensResult


@dataclass(frozen=True)
class InterventionDone:
    """What every intervention did: the layers it changed, the positions asked for (as written) and the ones
    changed (None: all), the lenses read, and the word the change is about (steered or ablated; a patch: its
    first target; None: none). A kind's class adds its own and names itself in `kind`."""

    kind: ClassVar[str] = ""
    layers: tuple[int, ...]
    positions: str
    changed_positions: tuple[int, ...] | None
    lenses: tuple[str, ...]
    word: str | None

    def to_json(self) -> dict:
        return {"kind": self.kind, "layers": list(self.layers), "positions": str(self.positions),
                "changed_positions": None if self.changed_positions is None else list(self.changed_positions),
                "lenses": list(self.lenses), **self.details()}

    def details(self) -> dict:
        """The kind's own keys of the JSON, after the common ones."""
        return {}


@dataclass(frozen=True)
class FitReport:
    """A fitted steering vector: whether it reached its objective, p(word) with it, its steps, why it stopped,
    and its own length in units of the layer's typical residual norm (`alpha`)."""

    reached: bool
    p: float
    steps: int
    stopped: str
    alpha: float

    def to_json(self) -> dict:
        return {"reached": self.reached, "p": round(self.p, 5), "steps": self.steps, "stopped": self.stopped,
                "alpha": round(self.alpha, 4)}


@dataclass(frozen=True)
class SteerDone(InterventionDone):
    """alphas: the sweep run; typical_norm: {layer: its typical residual norm} (alpha 1 adds a vector that long);
    generated_tokens: every generated token was steered too; objective and fit: a fitted vector's."""

    kind: ClassVar[str] = "steer"
    from_word: str
    direction: str
    alphas: tuple[float, ...]
    typical_norm: dict[int, float]
    generated_tokens: bool
    objective: str | None = None
    fit: FitReport | None = None

    def details(self) -> dict:
        out = {"word": self.word, "from_word": self.from_word or None, "direction": self.direction,
               "alphas": list(self.alphas), "typical_norm": _by_layer(self.typical_norm),
               "generated_tokens": self.generated_tokens}
        if self.fit is not None:
            out.update(objective=self.objective, fit=self.fit.to_json())
        return out


@dataclass(frozen=True)
class AblateDone(InterventionDone):
    """ablation: project (the component removed) or mean (set to its mean over `reference`: `means`)."""

    kind: ClassVar[str] = "ablate"
    from_word: str
    direction: str
    ablation: str
    reference: str | None = None
    means: dict[int, float] | None = None

    def details(self) -> dict:
        out = {"word": self.word, "from_word": self.from_word or None, "direction": self.direction,
               "ablation": self.ablation}
        if self.means is not None:
            out.update(reference=self.reference, means=_by_layer(self.means))
        return out


@dataclass(frozen=True)
class PatchDone(InterventionDone):
    """The source prompt's cells at source_positions copied into target_positions, one layer at a time."""

    kind: ClassVar[str] = "patch"
    source: str
    target_positions: tuple[int, ...]
    source_positions: tuple[int, ...]

    def details(self) -> dict:
        return {"source": self.source, "target_positions": list(self.target_positions),
                "source_positions": list(self.source_positions), "word": self.word}


def _by_layer(values: dict[int, float]) -> dict[str, float]:
    """{layer: value} with string keys (orjson refuses int keys), rounded as the JSON shows them."""
    return {str(layer): round(v, 4) for layer, v in values.items()}


@dataclass
class InterventionResult:
    """before: the plain readout; after[i]: the readout with change i (labels[i] names it: "alpha 0.4", "layer
    20"); intervention: what was done (a kind's `InterventionDone`); source: a patch's source prompt, read the
    same way; generated_before / generated_after[i]: the text generated without / with change i ("" when none
    was asked for), all with the sampling seed `seed`."""

    before: LensResult
    after: list[LensResult]
    labels: list[str]
    intervention: InterventionDone
    sweep: list[float] = field(default_factory=list)   # the swept value of each change (alpha, or layer)
    source: LensResult | None = None
    generated_before: str = ""
    generated_after: list[str] = field(default_factory=list)
    seed: int | None = None

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

    def to_text(self) -> str:
        """As the command line prints it without --json: what was done, the word's final probability before and
        after each change, and what was generated."""
        what = ", ".join(f"{k}={v}" for k, v in self.intervention.to_json().items() if v not in (None, "", []))
        out = [f"{self.before.model}: {self.before.prompt!r}", f"intervention: {what}",
               f"model's next token before: {self.before.model_next_token!r}; after: "
               + ", ".join(f"{label} {a.model_next_token!r}" for label, a in zip(self.labels, self.after))]
        if self.word is not None:
            out += [f"\nP({self.word!r}) at the last position, the model's output:",
                    self.dose_response().to_string(index=False)]
        if self.generated_after:
            out += [f"\ngenerated before (seed {self.seed}): {self.generated_before!r}"]
            out += [f"generated with {label}: {text!r}" for label, text in zip(self.labels, self.generated_after)]
        return "\n".join(out)

    def to_json(self) -> dict:
        out = {"before": self.before.to_json(), "after": [r.to_json() for r in self.after],
               "labels": self.labels, "intervention": self.intervention.to_json()}
        if self.word is not None:
            # the row before has no swept value: null (pandas holds it as NaN, which is not JSON)
            out["dose_response"] = [{"change": c, "value": None if pd.isna(v) else v, "prob": round_floats(p),
                                     "rank": int(k)} for c, v, p, k in self.dose_response().itertuples(index=False)]
        if self.source is not None:
            out["source"] = self.source.to_json()
        if self.generated_after:
            out["generated"] = {"before": self.generated_before, "after": self.generated_after, "seed": self.seed}
        return out

    def to_csv(self) -> str:
        frames = [self.before.long_frame().assign(readout="before")]
        frames += [r.long_frame().assign(readout=label) for label, r in zip(self.labels, self.after)]
        df = pd.concat(frames, ignore_index=True)
        return df[["readout"] + [c for c in df.columns if c != "readout"]].to_csv(index=False)

    def dumps(self) -> str:
        return dumps(self)

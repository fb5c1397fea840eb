"""How good a lens is: does some layer read what the model computes but does not say?

On a two-hop item ("The capital of the country where the Eiffel Tower stands is" -> Paris, through France) the
unspoken intermediate is France. Each lens is read at the prompt's last position at every layer it has, and the
item *hits* at a layer under hit@k when the first token of any of its intermediates (" France", with a leading
space) ranks within the lens's top k there (rank 1 = the top token; ties rank in the word's favour, as
`lenses.readout` ranks). Per lens, per layer: the hit rate (hit@1, hit@10); the "some layer" rate, the share of
items that hit at any layer; the target's rank (the word the model should say) at every layer and at the last.

The control: each item scored the same way on another item's intermediate (France's item on Italy: the next item
naming none of its words, `service/evaluating.control_of`). A lens that ranks every country high hits its control
about as often as the item's own; one that reads what this prompt computes beats it. Read a hit rate against its
control rate, layer by layer.

The best band of a hit-rate curve: the best layer (the first with the highest rate) and the contiguous layers
beside it whose rate is within one standard error of that peak, sqrt(p (1 - p) / n) for a peak p over n items,
and never less than one item (1 / n). Why: with tens of items, layers closer to the peak than that cannot be told
from it, so a single best layer would be the noise's choice; the band is the run of layers that read the
intermediate about as well as any, which is what a reader picks layers from. It is contiguous because a lens's
reading changes gradually with depth and a band is what one reads. No band where no item ever hits.

Unspoken items: those whose intermediate the model does not say itself (not in its top 10 at the last layer). A
logit lens reads at most what the model says, so the share of these a lens reads at some earlier layer is the
plainest measure of what it adds (`EvaluationResult.unspoken`).

`EvaluationResult.from_ranks` is the only code here that touches the engine's tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..lens_kinds import LOGIT
from .export import round_floats

HIT_AT = (1, 10)        # the k of hit@k reported
NO_CONTROL = 2**31 - 1  # the control rank of an item that has no control (no other item names other words)
UNSPOKEN_READ = "unspoken: read before the last layer, hit@10"      # a column of `EvaluationResult.summary`


@dataclass(frozen=True)
class Band:
    """Layers first..last (inclusive, contiguous) around `best` (the first layer at the peak `rate`), every one
    at or above `floor` (the peak less one standard error, at least one item)."""

    first: int
    last: int
    best: int
    rate: float
    floor: float

    def to_json(self) -> dict:
        return {"first": self.first, "last": self.last, "best": self.best, "rate": round(self.rate, 5),
                "floor": round(self.floor, 5)}

    def __str__(self) -> str:
        span = str(self.first) if self.first == self.last else f"{self.first}-{self.last}"
        return f"{span} (best {self.best}: {self.rate:.0%})"


def best_band(layers: list[int], rate: np.ndarray, n_items: int) -> Band | None:
    """The best band of a hit-rate curve `rate` [L] over `layers` (see the module docstring)."""
    rate = np.asarray(rate, dtype=np.float64)
    if rate.shape != (len(layers),):
        raise ValueError(f"rate {rate.shape} does not match {len(layers)} layers")
    if not len(layers) or n_items <= 0 or rate.max() <= 0:
        return None
    best = int(rate.argmax())
    peak = float(rate[best])
    floor = peak - max(1.0 / n_items, math.sqrt(peak * (1.0 - peak) / n_items)) - 1e-9
    lo = hi = best
    while lo > 0 and rate[lo - 1] >= floor:
        lo -= 1
    while hi < len(layers) - 1 and rate[hi + 1] >= floor:
        hi += 1
    return Band(layers[lo], layers[hi], layers[best], peak, max(0.0, floor))


@dataclass(frozen=True)
class LensScores:
    """One lens over n items, at its L layers.

    layers: int [L], ascending.
    intermediate_rank: int [n, L], the best rank (1 = top) of the first token of any of an item's intermediates.
    target_rank: int [n, L], the rank of the first token of the item's target.
    control_rank: int [n, L], the best rank of the first token of any of its control's intermediates (another
      item's; NO_CONTROL where it has none).
    """

    layers: np.ndarray
    intermediate_rank: np.ndarray
    target_rank: np.ndarray
    control_rank: np.ndarray

    def __post_init__(self):
        n_layers = len(self.layers)
        for name in ("intermediate_rank", "target_rank", "control_rank"):
            a = getattr(self, name)
            if a.ndim != 2 or a.shape[1] != n_layers:
                raise ValueError(f"{name} {a.shape} is not [items, {n_layers} layers]")
            if a.size and a.min() < 1:
                raise ValueError(f"{name} holds a rank below 1")
        if not self.intermediate_rank.shape == self.target_rank.shape == self.control_rank.shape:
            raise ValueError(f"intermediate_rank {self.intermediate_rank.shape}, target_rank "
                             f"{self.target_rank.shape} and control_rank {self.control_rank.shape} differ")

    @property
    def n_items(self) -> int:
        return self.intermediate_rank.shape[0]

    def hits(self, k: int) -> np.ndarray:
        """bool [n, L]: the intermediate within the top k."""
        return self.intermediate_rank <= k

    def hit_rate(self, k: int) -> np.ndarray:
        """float [L]: the share of items that hit at each layer."""
        return self.hits(k).mean(0)

    def some_layer(self, k: int) -> float:
        """The share of items that hit at some layer."""
        return float(self.hits(k).any(1).mean())

    def control_rate(self, k: int) -> np.ndarray:
        """float [L]: the share of items whose control (another item's intermediate) is within the top k."""
        return (self.control_rank <= k).mean(0)

    def control_some_layer(self, k: int) -> float:
        return float((self.control_rank <= k).any(1).mean())

    def band(self, k: int) -> Band | None:
        return best_band(self.layers.tolist(), self.hit_rate(k), self.n_items)

    def target_rate(self, k: int) -> np.ndarray:
        """float [L]: the share of items whose target is within the top k at each layer."""
        return (self.target_rank <= k).mean(0)

    def median_target_rank(self) -> np.ndarray:
        """float [L]."""
        return np.median(self.target_rank, axis=0)

    def to_json(self) -> dict:
        bands = {str(k): self.band(k) for k in HIT_AT}
        return {"layers": self.layers.tolist(),
                "hit_rate": {str(k): round_floats(self.hit_rate(k)) for k in HIT_AT},
                "some_layer": {str(k): round(self.some_layer(k), 5) for k in HIT_AT},
                "control_rate": {str(k): round_floats(self.control_rate(k)) for k in HIT_AT},
                "control_some_layer": {str(k): round(self.control_some_layer(k), 5) for k in HIT_AT},
                "best_band": {k: None if b is None else b.to_json() for k, b in bands.items()},
                "target_rate": {str(k): round_floats(self.target_rate(k)) for k in HIT_AT},
                "median_target_rank": round_floats(self.median_target_rank()),
                "target_rank_last": self.target_rank[:, -1].tolist(),
                "intermediate_rank": self.intermediate_rank.tolist(), "target_rank": self.target_rank.tolist(),
                "control_rank": self.control_rank.tolist()}


@dataclass(frozen=True)
class EvaluationResult:
    """Every loaded lens scored on the same items (see the module docstring).

    items: where they came from (a shipped set's name, or a file's); split: heldout, dev or all.
    names, prompts, targets [n]; intermediates [n] (each item's names of its intermediate).
    lenses: {lens: LensScores}, in the order read.
    """

    model: str
    items: str
    split: str
    names: list[str]
    prompts: list[str]
    targets: list[str]
    intermediates: list[list[str]]
    lenses: dict[str, LensScores] = field(default_factory=dict)
    jlens: str | None = None            # the Jacobian lens's source, when one was read

    def __post_init__(self):
        n = len(self.names)
        if not len(self.prompts) == len(self.targets) == len(self.intermediates) == n:
            raise ValueError("names, prompts, targets and intermediates differ in length")
        for name, scores in self.lenses.items():
            if scores.n_items != n:
                raise ValueError(f"the {name} lens scores {scores.n_items} items, not {n}")

    @classmethod
    def from_ranks(cls, ranks: dict[str, list], layers: dict[str, list[int]], n_intermediates: list[int],
                   n_controls: list[int], **meta) -> EvaluationResult:
        """ranks[lens][i]: item i's ranks at the last position, [L, n_intermediates[i] + n_controls[i] + 1] (its
        intermediates' first tokens, its control's, then its target's), a tensor or array; layers[lens]: the L
        layers read."""
        lenses = {}
        for name, per_item in ranks.items():
            inter, control, target = [], [], []
            for r, m, c in zip(per_item, n_intermediates, n_controls, strict=True):
                a = np.asarray(r.cpu() if hasattr(r, "cpu") else r, dtype=np.int64).reshape(len(layers[name]), -1)
                if a.shape[1] != m + c + 1:
                    raise ValueError(f"{a.shape[1]} ranks for {m} intermediates, {c} controls and a target")
                inter.append(a[:, :m].min(1))
                control.append(a[:, m:m + c].min(1) if c else np.full(len(a), NO_CONTROL))
                target.append(a[:, -1])
            lenses[name] = LensScores(np.asarray(layers[name], dtype=np.int64), np.stack(inter), np.stack(target),
                                      np.stack(control))
        return cls(lenses=lenses, **meta)

    @property
    def n_items(self) -> int:
        return len(self.names)

    def unspoken(self, k: int = 10) -> dict | None:
        """What a lens is for: of the items whose intermediate the model does not say (not in its own top k at its
        last layer, which the logit lens reads there), the share each lens has within its top k at some layer
        before that one. None without a logit lens; a lens's share None when every intermediate is said."""
        logit = self.lenses.get(LOGIT.name)
        if logit is None:
            return None
        last, quiet = int(logit.layers[-1]), logit.intermediate_rank[:, -1] > k
        read = {name: float(s.hits(k)[quiet][:, s.layers < last].any(1).mean()) if quiet.any() else None
                for name, s in self.lenses.items()}
        return {"k": k, "last_layer": last, "items": int(quiet.sum()), "read": read}

    def summary(self) -> pd.DataFrame:
        """One row per lens: the "some layer" rates, the unspoken items it reads before the last layer, the best
        band of hit@10 (and hit@1), the target at the last layer (its top-1 and top-10 rates and median rank)."""
        rows = []
        unspoken = self.unspoken() or {"items": 0, "read": {}}
        for name, s in self.lenses.items():
            rows.append({"lens": name, "items": s.n_items,
                         **{f"some layer hit@{k}": s.some_layer(k) for k in HIT_AT},
                         "control: some layer hit@10": s.control_some_layer(10),
                         "unspoken items": unspoken["items"],
                         UNSPOKEN_READ: unspoken["read"].get(name),
                         **{f"best band hit@{k}": str(s.band(k) or "none") for k in reversed(HIT_AT)},
                         "target top-1 at last layer": float((s.target_rank[:, -1] <= 1).mean()),
                         "target top-10 at last layer": float((s.target_rank[:, -1] <= 10).mean()),
                         "target median rank at last layer": float(np.median(s.target_rank[:, -1]))})
        return pd.DataFrame(rows)

    def frame(self) -> pd.DataFrame:
        """One row per lens and layer: hit@1 and hit@10 of the intermediate, of the control, of the target, and the
        target's median rank."""
        rows = []
        for name, s in self.lenses.items():
            rates = {f"hit@{k}": s.hit_rate(k) for k in HIT_AT}
            rates |= {f"control hit@{k}": s.control_rate(k) for k in HIT_AT}
            rates |= {f"target hit@{k}": s.target_rate(k) for k in HIT_AT}
            median = s.median_target_rank()
            for i, layer in enumerate(s.layers.tolist()):
                rows.append({"lens": name, "layer": layer, **{c: float(v[i]) for c, v in rates.items()},
                             "target median rank": float(median[i])})
        return pd.DataFrame(rows)

    def item_frame(self, lens: str) -> pd.DataFrame:
        """One row per item: its intermediate's best rank under `lens` and where, the target's rank at the last
        layer."""
        s = self.lenses[lens]
        best = s.intermediate_rank.argmin(1)
        return pd.DataFrame({"item": self.names, "intermediate": [", ".join(x) for x in self.intermediates],
                             "best rank": s.intermediate_rank.min(1), "at layer": s.layers[best],
                             "target": self.targets, "target rank at last layer": s.target_rank[:, -1]})

    def to_text(self) -> str:
        """As the command line prints it without --json: per lens the "some layer" rates and the best bands, then
        hit@1 and hit@10 per layer."""
        return "\n".join([
            f"{self.model}: {self.n_items} {self.split} items of {self.items}; an item hits at a layer when its "
            "intermediate's first token is within the lens's top k at the prompt's last position",
            self.summary().to_string(index=False, float_format=lambda x: f"{x:.3f}"),
            "\nper layer (the intermediate's hit rate, the target's, the target's median rank):",
            self.frame().to_string(index=False, float_format=lambda x: f"{x:.3f}")])

    def to_json(self) -> dict:
        return {"model": self.model, "items": self.items, "split": self.split, "n_items": self.n_items,
                "hit_at": list(HIT_AT), "jlens": self.jlens, "names": self.names, "prompts": self.prompts,
                "targets": self.targets, "intermediates": self.intermediates,
                "lenses": {name: s.to_json() for name, s in self.lenses.items()}, "unspoken": self.unspoken()}

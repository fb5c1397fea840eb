"""A word's direction in the residual stream at a layer: from the model's checkpoint and the Jacobian lens.

The lens reads logits = W_U norm(h), so a word's logit moves with w . h where w = g * W_U[word] (its
unembedding row through the final norm's scale: the logit-lens direction); what the Jacobian lens reads at
layer l moves with (J_l^T w) . h (the Jacobian-lens direction). The math is `lensapp.interventions`; here
are where its inputs come from: the rows off disk (`engine/run/weights.py`, read on demand, never from the
worker), and each layer's J from the loaded lens (`Jacobians`, which also says which layers it covers, so a
request for a J the lens lacks is refused when it is planned).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from ... import interventions as iv
from ...engine.run.families import Family
from ...engine.run.weights import CheckpointWeights, WeightsNotFound
from ...jlens import JacobianLens
from ..field import RequestError
from ..planning import NO_JLENS
from ..selection import span as span_text


@dataclass(frozen=True)
class Jacobians:
    """The Jacobian lens as an intervention uses it: `layers`, the layers it reads (its own, and the last, where
    J = I; empty: no lens), and `at(layer)`, each one's J."""

    lens: JacobianLens | None
    layers: list[int]
    n_layers: int
    d_model: int

    def at(self, layer: int) -> torch.Tensor:
        """J_layer [d_model, d_model] float32; RequestError when there is no lens, or no J at that layer."""
        if self.lens is None:
            raise RequestError(NO_JLENS)
        if layer == self.n_layers - 1:
            return torch.eye(self.d_model)
        if layer not in self.lens.J:
            raise RequestError(f"the Jacobian lens has no J at layer {layer}; it covers {span_text(self.lens.layers)}")
        return self.lens.J[layer].float()


class WordDirections:
    """Directions from one model's checkpoint (indexed on first use, then kept)."""

    def __init__(self, model: str | Path, family: Family):
        self.model, self.family = model, family
        self._weights: CheckpointWeights | None = None
        self._lock = threading.Lock()

    def direction(self, token_ids: tuple[int, ...], layer: int, kind: str, jacobians: Jacobians) -> torch.Tensor:
        """The direction [d_model] of token_ids[0] at `layer` (minus token_ids[1]'s, when given): `kind` logit or
        jacobian."""
        weights = self._checkpoint()
        w = iv.logit_direction(weights.unembedding_rows(list(token_ids)), weights.final_norm_scale())
        if kind == "jacobian":
            w = iv.jacobian_direction(w, jacobians.at(layer))
        return iv.difference(w[0], w[1]) if len(token_ids) > 1 else w[0]

    def _checkpoint(self) -> CheckpointWeights:
        with self._lock:
            if self._weights is None:
                try:
                    self._weights = CheckpointWeights(self.model, self.family)
                except WeightsNotFound as e:
                    raise RequestError(f"this model's weights cannot be read for a direction ({e})") from None
            return self._weights

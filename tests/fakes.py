"""Hand-written fakes the tests share (fakes over mocks)."""

from __future__ import annotations

import torch

from lensapp.fitting.steering import SteeringVector


class FitDeskFake:
    """The fitting desk (service/fits.py) without its process: every fit is a fixed random vector of `norm`, and
    each ask is kept (ids, layer, target_id, the SteerConfig), so a test can see where it was asked to fit."""

    def __init__(self, d_model: int, norm: float = 0.05):
        self.d_model, self.norm = d_model, norm
        self.asked: list[tuple] = []

    def check_allowed(self, client=None) -> None:
        pass

    def fit(self, ids, layer, target_id, steer, progress=None, work=0, ask=None) -> SteeringVector:
        self.asked.append((tuple(ids), layer, target_id, steer))
        v = torch.randn(self.d_model, generator=torch.Generator().manual_seed(layer))
        v = v / v.norm() * self.norm
        if progress is not None:
            progress(1, 0.9, self.norm)
        return SteeringVector(vector=v, layer=layer, reached=True, steps=1, p=0.9, norm=self.norm, typical_norm=1.0,
                              stopped="reached")

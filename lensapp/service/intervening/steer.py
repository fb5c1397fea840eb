"""Steer: add alpha * v to the residual stream leaving a layer (each layer of a span), one readout per alpha.

v is a word's direction made unit length and scaled by the layer's typical residual norm (`norms.py`), so an
alpha means the same push at every layer; several alphas make a dose-response sweep. v is the word's
logit-lens direction, its Jacobian-lens direction `J_l^T w`, the difference of two words' directions
(`from_word`), or a vector fitted (on the fitting desk, `fits.py`) to make the lens at the layer, or the
model's output, read the word (`direction`: logit, jacobian, fitted).

What it tells apart: a direction the model *uses* (the word's probability at the output climbs with alpha)
from one the lens merely reads (the lens above the layer reads the word, the output does not follow), and
where along the depth a push takes (the same alpha at each layer). Alpha 0 reads exactly as the plain lens.

The rules: a word is needed; a fitted vector belongs to one layer, may be fitted only where the host allows,
is fitted where it is applied (`fit_config` and `edits` read the same positions), and with the lens
objective must be applied at the last position (what that objective reads); a Jacobian direction needs a J
at every layer of the span; no alphas asked is the default sweep (`sweep`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ... import interventions as iv
from ...engine.run.edit import Edit
from ...fitting.steering import SteerConfig
from ...results import FitReport, SteerDone
from .. import cost
from ..field import RequestError
from ..fields import DEFAULT_ALPHAS, FITTED_MULTIPLES
from ..requests import InterveneRequest
from .kind import Changes, EngineCalls, PlanInputs, Planned, Reading
from .registry import intervention


@dataclass(frozen=True)
class SteerPlan:
    """word_ids: the word's first token, then the from-word's (when given), each as the model would write it after
    the prompt (prompts.py: `word`); alphas: as asked (empty: the default
    sweep); positions: the prompt positions steered (None: all); generated: every generated token too."""

    word: str
    word_ids: tuple[int, ...]
    from_word: str
    direction: str
    alphas: tuple[float, ...]
    objective: str
    positions: tuple[int, ...] | None
    generated: bool
    n_changes: int
    extra: cost.Cost = cost.NOTHING

    @property
    def words(self) -> tuple[str, ...]:
        return (self.word,)


def sweep(asked: tuple[float, ...], fitted_alpha: float | None = None) -> tuple[float, ...]:
    """The alphas swept: those asked; none asked, DEFAULT_ALPHAS, or for a fitted vector (its own length is
    alpha = fitted_alpha) FITTED_MULTIPLES times its own length."""
    if asked:
        return asked
    if fitted_alpha is None:
        return DEFAULT_ALPHAS
    return tuple(round(fitted_alpha * x, 4) for x in FITTED_MULTIPLES)


def fit_config(change: SteerPlan, max_steps: int, max_seconds: float) -> SteerConfig:
    """How a fitted vector is fitted: at the positions it will be applied at (None: all), to its objective."""
    where = "all" if change.positions is None else change.positions
    return SteerConfig(objective=change.objective, positions=where, max_steps=max_steps, max_seconds=max_seconds)


def edits(vectors: dict[int, torch.Tensor], alphas: tuple[float, ...], norms: list[float],
          positions: tuple[int, ...] | None, generated: bool) -> list[list[Edit]]:
    """Per alpha, an "add" edit at each layer of `vectors`: unit(v) * alpha * the layer's typical norm."""
    return [[Edit(layer, "add", iv.scaled(v, a, norms[layer]), positions, generated=generated)
             for layer, v in vectors.items()] for a in alphas]


@intervention("steer")
class Steer:
    def plan(self, req: InterveneRequest, reading: Reading, inputs: PlanInputs) -> SteerPlan:
        if not req.word.strip():
            raise RequestError("steering needs a word")
        span, positions = reading.span, reading.positions
        if req.direction == "fitted":
            if len(span) > 1:
                raise RequestError("a fitted vector belongs to one layer; choose one layer")
            inputs.fits.check_allowed(inputs.ask.client)
            if req.objective == "lens" and positions is not None and len(reading.ids) - 1 not in positions:
                raise RequestError("the lens objective reads the last position: include it in the positions changed")
        elif req.direction == "jacobian":
            for layer in span:
                inputs.jacobians.at(layer)                 # RequestError now, not after a minute of work
        words = [w for w in (req.word, req.from_word) if w.strip()]
        word_ids = tuple(t.token_ids[0] for t in inputs.prompts.words(words, reading.ids))
        # the readouts after: one per alpha swept (a fitted vector's in units of its own length, fitted later), but
        # alpha 0, which adds a zero vector and reads as the prompt before (runner.py)
        n = sum(1 for a in sweep(req.alphas, 1.0 if req.direction == "fitted" else None) if a)
        return SteerPlan(req.word, word_ids, req.from_word, req.direction, req.alphas, req.objective, positions,
                         generated=not req.prompt_only and positions is None, n_changes=n)

    def carry_out(self, planned: Planned[SteerPlan], run: EngineCalls) -> Changes:
        change, span = planned.change, planned.reading.span
        norms = run.typical_norms()
        fit = None
        if change.direction == "fitted":
            fitted = run.fit(planned.reading.ids, span[0], change.word_ids[0],
                             fit_config(change, run.limits.max_fit_steps, run.limits.max_fit_seconds))
            fit = FitReport(fitted.reached, fitted.p, fitted.steps, fitted.stopped, fitted.norm / norms[span[0]])
            vectors = {span[0]: fitted.vector}
        else:
            vectors = {layer: run.direction(change.word_ids, layer, change.direction) for layer in span}
        alphas = sweep(change.alphas, None if fit is None else fit.alpha)
        done = SteerDone(**planned.described(), word=change.word, from_word=change.from_word,
                         direction=change.direction, alphas=alphas,
                         typical_norm={layer: norms[layer] for layer in span}, generated_tokens=change.generated,
                         objective=change.objective if fit else None, fit=fit)
        return Changes([f"alpha {a:g}" for a in alphas], list(alphas),
                       edits(vectors, alphas, norms, change.positions, change.generated), done)

"""Interventions: steer, ablate or patch the residual stream inside the request's own trace, then read again.

    registry.py    the kinds by name, one decorator (`@intervention("steer")`); what a kind provides
    kind.py        what a kind is handed and hands back (`Reading`, `Planned`, `Changes`) and what it may ask of
                   the engine (`EngineCalls`): a kind imports it and registry.py, never the planner or runner
    steer.py       add alpha times a word's direction (a dose-response sweep)
    ablate.py      remove a word's direction, or set it to its mean over a reference
    patch.py       copy a source prompt's cells in, one layer at a time
    planner.py     a validated request -> a `Plan` (every rule, every forward counted), no engine call
    runner.py      the engine calls, and the `InterventionResult` (what was done: `results.InterventionDone`)
    directions.py  a word's direction: the checkpoint's rows, the Jacobian lens's J
    norms.py       each layer's typical residual norm (the unit of alpha), measured once

The tensor math is `lensapp.interventions` (pure); the engine applies the edits (`engine.run.protocol.Edit`).
"""

from __future__ import annotations

from . import ablate, patch, steer  # noqa: F401 - each registers its kind
from .directions import Jacobians
from .planner import Inputs, Limits, Plan, plan
from .registry import KINDS, intervention
from .runner import Intervener, generation_seed

__all__ = ["KINDS", "Inputs", "Intervener", "Jacobians", "Limits", "Plan", "generation_seed", "intervention", "plan"]

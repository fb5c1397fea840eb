"""What an intervention kind deals in: what it is handed, what it hands back, and what it may ask of the engine.

A kind (`steer.py`, `ablate.py`, `patch.py`) imports this module and `registry.py`, never the planner or the
runner: they hand it these small types, and it sees no more of them than they say.

    plan(request, reading, inputs) -> its plan        reading: `Reading`; inputs: `PlanInputs`; its plan: a
                                                       frozen dataclass with `ChangePlan`'s fields
    carry_out(planned, run) -> Changes                planned: `Planned` (its plan, the reading, the plain
                                                       readout's spec); run: `EngineCalls`

`prompt_positions` is the one reading of a position selection in the prompt: the planner's for the positions
changed, a patch's for its source's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from ...engine.run.edit import Edit
from ...engine.run.protocol import LensSpec
from ...results import InterventionDone, LensResult
from .. import cost

if TYPE_CHECKING:
    import torch

    from ...fitting.steering import SteerConfig
    from ..fits import FitDesk
    from ..prompts import Prompts
    from ..selection import Selection
    from .directions import Jacobians


def prompt_positions(selection: Selection, n: int) -> tuple[int, ...] | None:
    """Prompt positions a selection names ('all': None), negative counting from the end."""
    if selection.is_all:
        return None
    return tuple(selection.resolve(n, "position"))


@dataclass(frozen=True)
class Reading:
    """What every kind shares: the lenses and layers read, the layers changed (`span`), the prompt's ids, and the
    prompt positions the request names (None: all)."""

    lenses: tuple[str, ...]
    layers: list[int]
    span: tuple[int, ...]
    ids: tuple[int, ...]
    positions: tuple[int, ...] | None


class PlanInputs(Protocol):
    """What a kind's `plan` reads besides the request and the reading (`planner.Inputs` has it): the tokenizer, the
    Jacobian lens, and the fitting desk (who may fit)."""

    @property
    def prompts(self) -> Prompts: ...

    @property
    def jacobians(self) -> Jacobians: ...

    @property
    def fits(self) -> FitDesk: ...


class ChangePlan(Protocol):
    """What the planner reads of every kind's plan (each kind's dataclass adds its own)."""

    words: tuple[str, ...]
    positions: tuple[int, ...] | None
    n_changes: int
    extra: cost.Cost


P = TypeVar("P", bound=ChangePlan)


@dataclass(frozen=True)
class Planned(Generic[P]):
    """A plan as its kind carries it out: the kind's own plan (`change`; a kind writes `Planned[SteerPlan]`), the
    reading, the plain readout's spec (`base`), and the positions as the request named them (`named_positions`:
    its description says them so)."""

    change: P
    reading: Reading
    base: LensSpec
    named_positions: str

    def described(self) -> dict:
        """What every kind's description shares (`results.InterventionDone`'s fields, the word aside)."""
        return {"layers": self.reading.span, "positions": self.named_positions,
                "changed_positions": self.change.positions, "lenses": self.reading.lenses}


class FitLimits(Protocol):
    """How long a fitted vector may fit (`planner.Limits` has it)."""

    @property
    def max_fit_steps(self) -> int: ...

    @property
    def max_fit_seconds(self) -> float: ...


class EngineCalls(Protocol):
    """What a kind may ask for that needs the engine, while it builds its edits (`runner.Run` answers)."""

    @property
    def limits(self) -> FitLimits: ...

    def typical_norms(self) -> list[float]:
        """[n_layers]: each layer's typical residual norm (norms.py)."""
        ...

    def direction(self, token_ids: tuple[int, ...], layer: int, kind: str) -> torch.Tensor:
        """A word's direction [d_model] at `layer` (minus a from-word's, when given): `kind` logit or jacobian."""
        ...

    def fit(self, ids: tuple[int, ...], layer: int, target_id: int, steer: SteerConfig):
        """A vector fitted on the fitting desk (fits.py)."""
        ...

    def kept_streams(self, ids: tuple[int, ...], layers: tuple[int, ...]) -> torch.Tensor:
        """The residual streams of a text at `layers`, every position: [layers, positions, d_model] float32."""
        ...

    def read_source(self, spec: LensSpec, text: str) -> tuple[torch.Tensor, LensResult]:
        """A source prompt read as `spec` says: its kept streams, and its readout (no targets)."""
        ...


@dataclass(frozen=True)
class Changes:
    """What a kind's plan became: labels[i], sweep[i] and edits[i] for the readout after change i; what was done;
    a patch's source, read as the target is."""

    labels: list[str]
    sweep: list[float]
    edits: list[list[Edit]]
    done: InterventionDone
    source: LensResult | None = field(default=None)

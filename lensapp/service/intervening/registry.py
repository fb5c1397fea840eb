"""The intervention kinds, by name: one decorator registers a kind, and the planner and the runner find it here.

A kind is a class with two methods, in a module of its own whose docstring says what it does and which
outcomes it tells apart (`steer.py`, `ablate.py`, `patch.py`):

    plan(request, reading, inputs) -> its plan       pure: every rule the kind has, checked before any engine call
    carry_out(planned, run) -> Changes               its edits, asking the run (`kind.EngineCalls`) for what needs
                                                     the engine

What it is handed and hands back are `kind.py`'s small types (a kind imports that module and this one, never the
planner or the runner). Its plan (a frozen dataclass) carries what the planner counts for every kind (`ChangePlan`):
`words` (the targets it reads first: the steered or ablated word), `positions` (the prompt positions it changes;
None: all), `n_changes` (the readouts after: a change that edits nothing has none) and `extra` (the forwards it
makes besides: `cost.py`). A variant of a kind (a layer, a strength, a direction) is a field of its request, never
another registration. CONTRIBUTING.md has the recipe for a new kind.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Protocol

from ..field import RequestError
from .kind import ChangePlan, Changes, EngineCalls, PlanInputs, Planned, Reading

if TYPE_CHECKING:
    from ..requests import InterveneRequest


class InterventionKind(Protocol):
    name: str

    def plan(self, req: InterveneRequest, reading: Reading, inputs: PlanInputs) -> ChangePlan: ...

    def carry_out(self, planned: Planned, run: EngineCalls) -> Changes: ...


KINDS: dict[str, InterventionKind] = {}


def intervention(name: str) -> Callable[[type], type]:
    """Register the decorated class, as one instance, as the kind `name` (the request's `intervention`)."""
    def register(cls: type) -> type:
        if name in KINDS:
            raise ValueError(f"an intervention kind {name!r} is registered already")
        kind = cls()
        kind.name = name
        KINDS[name] = kind
        return cls
    return register


def kind_of(name: str) -> InterventionKind:
    """The kind a request names; RequestError when none is registered by that name."""
    if name not in KINDS:
        raise RequestError(f"no intervention kind {name!r}; one of {', '.join(KINDS)}")
    return KINDS[name]

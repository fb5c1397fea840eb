"""From a validated `InterveneRequest` to a plan: every rule checked, every forward counted, no engine call.

`plan(request, inputs)` resolves what every kind shares (the lenses and layers read, the layers and
positions changed, the prompt's ids, the plain readout's `LensSpec`, the words read as the model would write them
after the prompt: prompts.py's `word`), asks the request's kind for its own plan (`registry.py`; the kind
is handed a `kind.Reading` and only what `kind.PlanInputs` names of the inputs), and counts the cost: the
readout before and one per change (each with its targets' continuations), the forwards the kind makes
besides (a patch's source, a mean ablation's reference), and the generations before and after. It takes what
it needs explicitly (`Inputs`), never the service, so the CLI can ask it before an engine starts and a test
without one.

The rules decided here, once: both lenses (or the Jacobian lens) without a Jacobian lens are refused
(`planning.lens_layers`: NO_JLENS); positions are counted in the prompt (negative from its end; 'all': None).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...config import MAX_CONTINUATION_TOKENS
from ...engine.run.protocol import LensSpec, ModelInfo, Sampling
from ...lens_kinds import read_by
from ...results import Target
from .. import cost, planning
from ..asks import HOST, Ask
from ..fits import FitDesk
from ..prompts import Prompts
from ..requests import InterveneRequest
from .directions import Jacobians
from .kind import ChangePlan, Planned, Reading, prompt_positions
from .registry import kind_of


@dataclass(frozen=True)
class Limits:
    """The app's settings an intervention is planned and run under (config.Config; token_weight: cost.py)."""

    part_cells: int
    token_weight: int
    max_work: int
    request_timeout: float
    max_fit_steps: int
    max_fit_seconds: float

    def check(self, work: cost.Cost) -> None:
        cost.check(work, self.token_weight, self.max_work, "this intervention")

    def deadline(self, work: cost.Cost) -> float:
        return cost.deadline(work, self.token_weight, self.max_work, self.request_timeout)


@dataclass(frozen=True)
class Inputs:
    """What planning an intervention needs: the model's shape, its tokenizer, the Jacobian lens, the limits, the
    fitting desk (who may fit; a fitted vector comes from it), and who asks (their turn, their budget, and whether
    they may fit: asks.py)."""

    info: ModelInfo
    prompts: Prompts
    jacobians: Jacobians
    limits: Limits
    fits: FitDesk
    ask: Ask = HOST


@dataclass(frozen=True)
class Plan:
    """A request resolved against the model and its prompt(s), before any engine call: its kind's own plan
    (`change`), the targets read (the kind's words first), the plain readout's spec, and every forward."""

    request: InterveneRequest
    kind: str
    reading: Reading
    change: ChangePlan
    targets: tuple[Target, ...]
    base: LensSpec
    cost: cost.Cost

    def decides(self) -> tuple:
        """What decides the result, as a cache key: the request resolved (its layers and positions as indices,
        the kind's own plan, the targets' tokens, the readout's spec) and, where texts are generated, their
        sampling (`Sampling.decides`: nothing for greedy decoding). Two spellings of one request are one key."""
        req = self.request
        generated = (req.new_tokens, Sampling(req.new_tokens, float(req.temperature), req.seed).decides) \
            if req.new_tokens else ()
        r = self.reading
        return (self.kind, req.prompt, (r.lenses, tuple(r.layers), r.span, r.ids, r.positions), self.change,
                self.targets, self.base, generated)

    def planned(self) -> Planned:
        """What the plan's kind is handed to carry it out (`kind.Planned`), no more."""
        return Planned(self.change, self.reading, self.base, str(self.request.positions))


def plan(req: InterveneRequest, inputs: Inputs) -> Plan:
    """Every check the request gets that needs no engine; RequestError in one line."""
    info, prompts = inputs.info, inputs.prompts
    kind = kind_of(req.intervention)
    lenses = read_by(req.lens)
    layers = planning.lens_layers(req.layers, lenses, info.n_layers, inputs.jacobians.layers)
    span = tuple(req.layer.resolve(info.n_layers))
    ids = tuple(prompts.ids(req.prompt, req.chat))
    reading = Reading(lenses, layers, span, ids, prompt_positions(req.positions, len(ids)))
    change = kind.plan(req, reading, inputs)
    words = change.words + req.targets
    targets = tuple(prompts.words(words, ids)) if words else ()
    target_ids = [list(t.token_ids) for t in targets]
    base = planning.lens_spec(list(ids), layers, req.k, lenses, info.n_layers, inputs.jacobians.layers, target_ids,
                              req.raw)
    work = cost_of(reading, change, target_ids, req.new_tokens, inputs.limits.part_cells)
    inputs.limits.check(work)
    return Plan(req, kind.name, reading, change, targets, base, work)


def cost_of(reading: Reading, change: ChangePlan, target_ids: list[list[int]], new_tokens: int,
            part_cells: int) -> cost.Cost:
    """Every forward: the readout before and one per change (each with its targets' continuations), what the
    kind makes besides, and the generations before and after (each reads only its new tokens' last layer)."""
    n = len(reading.ids)
    continuations = [len(t) for t in target_ids if 1 < len(t) <= MAX_CONTINUATION_TOKENS]
    readouts = change.n_changes + 1
    work = cost.readout(n, len(reading.layers), len(reading.lenses), continuations, part_cells) * readouts
    work = work + change.extra
    if new_tokens:
        work = work + cost.forward(n + new_tokens, 1, 1, read_positions=new_tokens) * readouts
    return work

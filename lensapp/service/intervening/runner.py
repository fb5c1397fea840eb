"""Carrying out a plan: the engine calls an intervention makes, and the `InterventionResult` they make up.

`Intervener` is one model's: it keeps what is measured or read once (the typical norms, the checkpoint's
directions). Each request gets a `Run`, which the request's kind asks for what needs the engine (the typical
norms, a direction, a fitted vector, a reference's or a source's streams: `kind.EngineCalls`, all the kind
knows of it) while it builds its edits from its `kind.Planned` (`Plan.planned`); then
the run sends the plain readout's `LensSpec` and one edited copy per change to the engine together (each
cut into parts like any readout; vLLM batches them with everyone else's requests, and an edit changes only
its own request), and, when asked, the generations before and after as parts of one request
(`engine.generate_all`), all sampled with one seed (`generation_seed`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from ...engine.run.families import Family
from ...engine.run.protocol import LensSpec, Sampling
from ...lens_kinds import LOGIT
from ...results import InterventionResult, LensResult
from .. import cost, planning
from ..requests import InterveneRequest
from . import planner
from .directions import WordDirections
from .norms import REFERENCE_TEXT, TypicalNorms
from .planner import Inputs, Limits, Plan
from .registry import KINDS


def generation_seed(seed: int | None) -> int:
    """The seed the texts before and after are sampled with: the request's, or 0 when it names none. One seed for
    both, so they differ only by the change (and greedy decoding ignores it)."""
    return 0 if seed is None else seed


class Intervener:
    """Interventions on one model's engine."""

    def __init__(self, engine, model: str | Path, family: Family):
        self.engine = engine
        self.norms = TypicalNorms()
        self.directions = WordDirections(model, family)

    def plan(self, req: InterveneRequest, inputs: Inputs) -> Plan:
        """Every check the request gets that needs no engine (`planner.plan`): the CLI asks this first."""
        return planner.plan(req, inputs)

    def run(self, req: InterveneRequest, inputs: Inputs, progress=None) -> InterventionResult:
        """`progress(step, p, norm)` hears a fitted vector's steps (fits.py)."""
        return self.carry_out(planner.plan(req, inputs), inputs, progress)

    def carry_out(self, plan: Plan, inputs: Inputs, progress=None) -> InterventionResult:
        """The result of a plan made with these `inputs` (`plan`); its work is paid for as it starts (`inputs.ask`),
        and given back if the engine refuses it (`asks.Ask.paying`)."""
        with inputs.ask.paying(plan.cost.units(inputs.limits.token_weight)):
            return Run(self, inputs, progress).result(plan)


class Run:
    """One intervention's engine calls: what its kind asks for (`kind.EngineCalls`), the readouts, the
    generations."""

    def __init__(self, intervener: Intervener, inputs: Inputs, progress=None):
        self.engine, self.inputs, self.progress = intervener.engine, inputs, progress
        self.client = inputs.ask.client             # whose turn its engine calls take
        self._norms, self._directions = intervener.norms, intervener.directions

    @property
    def limits(self) -> Limits:
        return self.inputs.limits

    # -- what a kind asks for ------------------------------------------------------------------------
    def typical_norms(self) -> list[float]:
        return self._norms.get(self.engine, self.inputs.prompts.ids(REFERENCE_TEXT), self.inputs.info.n_layers,
                               self.client)

    def direction(self, token_ids: tuple[int, ...], layer: int, kind: str) -> torch.Tensor:
        return self._directions.direction(token_ids, layer, kind, self.inputs.jacobians)

    def fit(self, ids: tuple[int, ...], layer: int, target_id: int, steer):
        """A vector fitted on the fitting desk (fits.py): cached, or one already under way, or when its turn comes."""
        work = cost.fit(len(ids), steer.max_steps).units(self.limits.token_weight)
        return self.inputs.fits.fit(tuple(ids), layer, target_id, steer, self.progress, work, self.inputs.ask)

    def kept_streams(self, ids: tuple[int, ...], layers: tuple[int, ...]) -> torch.Tensor:
        """The residual streams of a text at `layers`, every position: [layers, positions, d_model] float32."""
        n = self.inputs.info.n_layers
        spec = planning.lens_spec(list(ids), [n - 1], 1, (LOGIT.name,), n, [])
        (out,) = self.engine.lens([dataclasses.replace(spec, keep_layers=tuple(layers))], client=self.client)
        return out.kept.float()

    def read_source(self, spec: LensSpec, text: str) -> tuple[torch.Tensor, LensResult]:
        """A source prompt read as `spec` says: its kept streams, and its readout (no targets)."""
        (out,) = self.engine.lens([spec], client=self.client)
        return out.kept, self._lens_result(out, text, spec.input_ids, spec.layers, ())

    # -- the result ----------------------------------------------------------------------------------
    def result(self, plan: Plan) -> InterventionResult:
        req, reading = plan.request, plan.reading
        changes = KINDS[plan.kind].carry_out(plan.planned(), self)
        # A change that edits nothing (a sweep's alpha 0: a zero vector added) reads and writes exactly as the prompt
        # unchanged: its readout and its text are the ones before, not traces of their own.
        nothing = [all(edit.changes_nothing for edit in change) for change in changes.edits]
        edited = [change for change, none in zip(changes.edits, nothing) if not none]
        specs = [plan.base] + [dataclasses.replace(plan.base, edits=tuple(change)) for change in edited]
        deadline = self.limits.deadline(plan.cost)
        results = [self._lens_result(out, req.prompt, reading.ids, reading.layers, plan.targets)
                   for out in self.engine.lens(specs, deadline, self.client)]
        seed = generation_seed(req.seed)
        texts = (self._generate(reading.ids, Sampling(req.new_tokens, float(req.temperature), seed), edited, deadline)
                 if req.new_tokens else [""])
        return InterventionResult(before=results[0], after=spread(results, nothing), labels=changes.labels,
                                  sweep=changes.sweep, intervention=changes.done, source=changes.source,
                                  generated_before=texts[0],
                                  generated_after=spread(texts, nothing) if req.new_tokens else [],
                                  seed=seed if req.new_tokens else None)

    def _generate(self, ids, sampling: Sampling, edits, deadline: float) -> list[str]:
        """The text generated without and with each change (the one without first), each a part of one engine
        request (in flight together, taking turns with everyone else's); one readout row, so each costs little
        more than the generation."""
        n = self.inputs.info.n_layers
        spec = dataclasses.replace(planning.lens_spec(list(ids), [n - 1], 1, (LOGIT.name,), n, []), read_prompt=False)
        specs = [dataclasses.replace(spec, edits=tuple(change)) for change in [[]] + edits]
        return [self.inputs.prompts.text(out.token_ids)
                for out in self.engine.generate_all(specs, sampling, deadline, self.client)]

    def _lens_result(self, out, prompt: str, ids, layers, targets) -> LensResult:
        target_ids = [list(t.token_ids) for t in targets]
        return LensResult.from_output(out, prompt=prompt, ids=list(ids), layers=list(layers),
                                      decode=self.inputs.prompts.decode, targets=list(targets),
                                      continuation_of=planning.continuation_index(target_ids),
                                      model=self.inputs.info.name)


def spread(before_then_edited: list, nothing: list[bool]) -> list:
    """Each change's value, in order: the one before (the first) for a change that edits nothing, else the next of
    the edited changes' (the rest)."""
    edited = iter(before_then_edited[1:])
    return [before_then_edited[0] if none else next(edited) for none in nothing]

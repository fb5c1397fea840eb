"""Interventions: steer, ablate or patch the residual stream inside the request's own trace, then read again.

`Intervener.run(request)` turns an `InterveneRequest` into the plain readout's `LensSpec` and one edited
copy per change (`engine.protocol.Edit`), sends them to the engine together (vLLM batches them with
everyone else's requests, and an edit changes only its own request), and builds an `InterventionResult`.

- **Steer**: add `alpha * v`, with `v` a word's direction (`lensapp.interventions`) made unit length and
  scaled by the layer's typical residual norm, so an alpha means the same at every layer. One readout per
  alpha: the dose-response sweep. `v` is the word's logit-lens direction (its unembedding row through the
  final norm's scale), its Jacobian-lens direction `J_l^T w`, the difference of two words' directions, or
  a vector fitted on the transformers backend to make the lens (or the output) read the word.
- **Ablate**: at every layer of the span, remove the component along the word's direction, or set it to
  its mean over a reference text.
- **Patch**: copy the source prompt's stream at (layer, position) into the target's, one layer at a time
  over the span: a sweep over layers.

The directions come from the model's checkpoint (`engine/weights.py`) and the service's Jacobian lens, not
from the worker. Each layer's typical residual norm is measured once, on a reference paragraph, and kept.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch

from .. import interventions as iv
from ..config import LENS_CHOICES, MAX_CONTINUATION_TOKENS, MAX_SWEEP
from ..engine.protocol import Edit, LensSpec, Sampling
from ..engine.weights import CheckpointWeights, WeightsNotFound
from ..results import InterventionResult, LensResult
from . import cost, planning
from .field import RequestError
from .fields import ALPHAS
from .requests import InterveneRequest
from .selection import Selection
from .selection import span as span_text

# A paragraph of plain English: each layer's typical residual norm (the unit of alpha) is measured on it.
REFERENCE_TEXT = ("The old harbour town wakes early. Fishing boats come back before the sun is high, and the "
                  "market fills with people buying bread, fruit and the morning's catch. Children walk to "
                  "school along the river, and the church bell rings the hour.")


class Plan(NamedTuple):
    """A request resolved against the model and its prompt(s), before any engine call."""

    req: InterveneRequest
    lenses: tuple[str, ...]
    layers: list[int]                      # read
    span: list[int]                        # changed
    ids: list[int]
    targets: list
    base: LensSpec                         # the plain readout
    positions: tuple[int, ...] | None      # changed (None: all)
    source_ids: list[int]                  # a patch's source prompt
    sources: tuple[int, ...] | None        # its positions, one per changed position
    cost: cost.Cost                        # every forward it makes (service/cost.py)


class Changes(NamedTuple):
    """One kind's plan: a label, a swept value and a list of edits per readout after; what to say of it."""

    labels: list[str]
    sweep: list[float]
    edits: list[list[Edit]]
    details: dict
    source: LensResult | None = None


class Intervener:
    def __init__(self, service):
        self.service = service
        self._norms: list[float] | None = None
        self._weights: CheckpointWeights | None = None

    # -- the request --------------------------------------------------------------------------------
    def plan(self, req: InterveneRequest) -> Plan:
        """Every check the request gets that needs no engine: the CLI asks this before vLLM starts."""
        service, info = self.service, self.service.info
        names = self._lenses(req.lens)
        layers = planning.lens_layers(req.layers, names, info.n_layers, service.jlens_layers)
        span = req.layer.resolve(info.n_layers)
        ids = service.prompts.ids(req.prompt, req.chat)
        if req.intervention != "patch" and not req.word.strip():
            raise RequestError(f"{'steering' if req.intervention == 'steer' else 'ablation'} needs a word")
        if req.intervention == "ablate" and req.direction == "fitted":
            raise RequestError("ablate along a word's logit or jacobian direction, not a fitted one")
        if req.direction == "fitted" and req.intervention == "steer":
            if len(span) > 1:
                raise RequestError("a fitted vector belongs to one layer; choose one layer")
            service.fits.check_allowed()
        if req.intervention != "patch" and req.direction == "jacobian":
            for layer in span:
                self._jacobian(layer)                       # RequestError now, not after a minute of work
        if req.intervention == "patch" and len(span) > MAX_SWEEP:
            raise RequestError(f"a patch sweeps at most {MAX_SWEEP} layers at once; got {len(span)}")
        words = ((req.word,) if req.intervention != "patch" else ()) + req.targets
        targets = [service.prompts.target(t) for t in words]
        positions = self._positions(req.positions, len(ids))
        source_ids, sources = [], None
        if req.intervention == "patch":
            source_ids, positions, sources = self._patch_cells(req, ids, positions)
        base = planning.lens_spec(ids, layers, req.k, names, info.n_layers, service.jlens_layers,
                                  [list(t.token_ids) for t in targets], req.raw)
        work = self._cost(req, names, layers, span, ids, targets, source_ids)
        service.check_cost(work, "this intervention")
        return Plan(req, names, layers, span, ids, targets, base, positions, source_ids, sources, work)

    def _cost(self, req, names, layers, span, ids, targets, source_ids) -> cost.Cost:
        """Every forward the intervention makes: the readout before and one per change (each with its targets'
        continuations), a patch's source, a mean ablation's reference, and the generations before and after."""
        changes = 1 if req.intervention == "ablate" else len(req.alphas if req.intervention == "steer" else span)
        continuations = [len(t.token_ids) for t in targets if 1 < len(t.token_ids) <= MAX_CONTINUATION_TOKENS]
        parts = self.service.cfg.part_cells
        work = cost.readout(len(ids), len(layers), len(names), continuations, parts) * (changes + 1)
        if req.intervention == "patch":
            work = work + cost.forward(len(source_ids), len(layers), len(names))
        if req.intervention == "ablate" and req.ablation == "mean":
            work = work + cost.forward(len(self.service.prompts.ids(req.reference or REFERENCE_TEXT)), 1, 1)
        if req.new_tokens:
            # each a generation that reads only its new tokens' last layer (its prompt is not read: `_generate`)
            work = work + cost.forward(len(ids) + req.new_tokens, 1, 1, read_positions=req.new_tokens) * (changes + 1)
        return work

    def run(self, req: InterveneRequest, progress=None) -> InterventionResult:
        plan = self.plan(req)
        req = plan.req
        if req.intervention == "steer":
            changes = self._steer(plan, progress)
        elif req.intervention == "ablate":
            changes = self._ablate(plan)
        else:
            changes = self._patch(plan)
        specs = [plan.base] + [dataclasses.replace(plan.base, edits=tuple(e)) for e in changes.edits]
        deadline = self.service.deadline(plan.cost)
        results = [self._result(out, req.prompt, plan.ids, plan.layers, plan.targets)
                   for out in self.service.engine.lens(specs, deadline)]
        before_text, after_text = (self._generate(req, plan.ids, changes.edits, deadline) if req.new_tokens
                                   else ("", []))
        described = {"kind": req.intervention, "layers": plan.span, "positions": req.positions,
                     "changed_positions": None if plan.positions is None else list(plan.positions),
                     "lenses": list(plan.lenses), **changes.details}
        return InterventionResult(before=results[0], after=results[1:], labels=changes.labels, sweep=changes.sweep,
                                  intervention=described, source=changes.source, generated_before=before_text,
                                  generated_after=after_text)

    def _lenses(self, lens: str) -> tuple[str, ...]:
        """The lenses read: `both` reads only the logit lens when no Jacobian lens is loaded."""
        if lens == "both" and self.service.jlens is None:
            return ("logit",)
        return LENS_CHOICES[lens]

    def _result(self, out, prompt, ids, layers, targets) -> LensResult:
        service = self.service
        return LensResult.from_output(out, prompt=prompt, ids=ids, layers=layers, decode=service.prompts.decode,
                                      targets=targets, continuation_of=planning.continuation_index(
                                          [list(t.token_ids) for t in targets]), model=service.info.name)

    # -- steer ----------------------------------------------------------------------------------------
    def _steer(self, plan: Plan, progress) -> Changes:
        req, ids, span, positions = plan.req, plan.ids, plan.span, plan.positions
        norms = self.typical_norms()
        generated = not req.prompt_only and positions is None
        details = {"word": req.word, "from_word": req.from_word or None, "direction": req.direction,
                   "alphas": list(req.alphas), "typical_norm": {str(layer): round(norms[layer], 4) for layer in span},
                   "generated_tokens": generated}
        if req.direction == "fitted":
            fit = self._fitted(req, ids, span[0], positions, progress)
            # A fitted vector's own length is alpha = fitted_alpha; the default sweep is 0, 1/2, 1 and 2 times it.
            fitted_alpha = fit.norm / norms[span[0]]
            if req.alphas == ALPHAS.default:
                req = dataclasses.replace(req, alphas=tuple(round(fitted_alpha * x, 4) for x in (0, 0.5, 1, 2)))
                details["alphas"] = list(req.alphas)
            details.update(objective=req.objective, fit={"reached": fit.reached, "p": round(fit.p, 5),
                                                         "steps": fit.steps, "stopped": fit.stopped,
                                                         "alpha": round(fitted_alpha, 4)})
            vectors = {span[0]: fit.vector}
        else:
            vectors = {layer: self.direction(req.word, layer, req.direction, req.from_word) for layer in span}
        edits = [[Edit(layer, "add", iv.scaled(vectors[layer], a, norms[layer]), positions, generated=generated)
                  for layer in span] for a in req.alphas]
        return Changes([f"alpha {a:g}" for a in req.alphas], list(req.alphas), edits, details)

    def direction(self, word: str, layer: int, kind: str, from_word: str = "") -> torch.Tensor:
        """A word's direction at `layer` [d_model] (minus `from_word`'s, when given): `kind` logit or jacobian."""
        weights = self._checkpoint()
        ids = [self.service.prompts.target(w).token_ids[0] for w in (word, from_word) if w.strip()]
        w = iv.logit_direction(weights.unembedding_rows(ids), weights.final_norm_scale())
        if kind == "jacobian":
            J = self._jacobian(layer)
            w = iv.jacobian_direction(w, J)
        return iv.difference(w[0], w[1]) if len(ids) > 1 else w[0]

    def _jacobian(self, layer: int) -> torch.Tensor:
        lens = self.service.jlens
        if lens is None:
            raise RequestError(planning.NO_JLENS)
        if layer == self.service.info.n_layers - 1:
            return torch.eye(self.service.info.d_model)
        if layer not in lens.J:
            raise RequestError(f"the Jacobian lens has no J at layer {layer}; it covers {span_text(lens.layers)}")
        return lens.J[layer].float()

    def typical_norms(self) -> list[float]:
        """Each layer's typical residual norm (the median over positions of ||h||, on REFERENCE_TEXT)."""
        if self._norms is None:
            info = self.service.info
            ids = self.service.prompts.ids(REFERENCE_TEXT)
            spec = dataclasses.replace(planning.lens_spec(ids, list(range(info.n_layers)), 1, ("logit",),
                                                          info.n_layers, []), norms=True)
            (out,) = self.service.engine.lens([spec])
            self._norms = [float(x) for x in out.norms]
        return self._norms

    def _fitted(self, req, ids, layer, positions, progress):
        """A vector fitted (on the fitting desk, `fits.py`) where it will be applied: at `positions` (None: all)."""
        from ..fitting.steering import SteerConfig

        cfg = self.service.cfg
        target = self.service.prompts.target(req.word).token_ids[0]
        where = "all" if positions is None else tuple(positions)
        if req.objective == "lens" and positions is not None and len(ids) - 1 not in positions:
            raise RequestError("the lens objective reads the last position: include it in the positions changed")
        steer = SteerConfig(objective=req.objective, positions=where, max_steps=cfg.max_fit_steps,
                            max_seconds=cfg.max_fit_seconds)
        return self.service.fits.fit(tuple(ids), layer, target, steer, progress)

    # -- ablate ---------------------------------------------------------------------------------------
    def _ablate(self, plan: Plan) -> Changes:
        req, span, positions = plan.req, plan.span, plan.positions
        directions = {layer: self.direction(req.word, layer, req.direction, req.from_word) for layer in span}
        details = {"word": req.word, "from_word": req.from_word or None, "direction": req.direction,
                   "ablation": req.ablation}
        if req.ablation == "project":
            edits = [Edit(layer, "project_out", directions[layer], positions) for layer in span]
        else:
            means = self._reference_means(req.reference or REFERENCE_TEXT, span, directions)
            edits = [Edit(layer, "set_component", directions[layer], positions, value=means[layer]) for layer in span]
            details.update(reference=req.reference or REFERENCE_TEXT,
                           means={str(k): round(v, 4) for k, v in means.items()})
        where = f"layer {span[0]}" if len(span) == 1 else f"layers {span_text(span)}"
        return Changes([f"{req.ablation} {where}"], [], [edits], details)

    def _reference_means(self, text: str, span: list[int], directions: dict) -> dict[int, float]:
        """The mean component along each layer's direction over the reference's positions (all but the first)."""
        info = self.service.info
        ids = self.service.prompts.ids(text)
        spec = dataclasses.replace(planning.lens_spec(ids, [info.n_layers - 1], 1, ("logit",), info.n_layers, []),
                                   keep_layers=tuple(span))
        (out,) = self.service.engine.lens([spec])
        kept = out.kept.float()                                   # [layers, positions, d]
        return {layer: float((kept[i, 1:] @ iv.unit(directions[layer])).mean()) for i, layer in enumerate(span)}

    # -- patch ----------------------------------------------------------------------------------------
    def _patch_cells(self, req, ids, positions) -> tuple[list[int], tuple[int, ...], tuple[int, ...]]:
        """(the source's ids, the target positions, the source position each is copied from)."""
        if not req.source.strip():
            raise RequestError("patching needs a source prompt to copy cells from")
        source_ids = self.service.prompts.ids(req.source, req.chat)
        positions = positions or tuple(range(len(ids)))
        if req.source_positions:
            sources = self._positions(req.source_positions, len(source_ids)) or tuple(range(len(source_ids)))
        else:                                   # as many as the target's, aligned at the end
            shift = len(source_ids) - len(ids)
            sources = tuple(p + shift for p in positions)
            if any(not 0 <= p < len(source_ids) for p in sources):
                raise RequestError("the source prompt is too short to align these positions at its end; "
                                   "name the source positions")
        if len(sources) != len(positions):
            raise RequestError(f"{len(positions)} target positions but {len(sources)} source positions")
        return source_ids, positions, sources

    def _patch(self, plan: Plan) -> Changes:
        """One readout per layer of the span, each with the source's cells copied in at that layer alone."""
        req, span = plan.req, plan.span
        spec = dataclasses.replace(plan.base, input_ids=tuple(plan.source_ids), target_ids=(), continuations=(),
                                   keep_layers=tuple(span), keep_positions=plan.sources)
        (out,) = self.service.engine.lens([spec])
        edits = [[Edit(layer, "replace", out.kept[i].float(), plan.positions)] for i, layer in enumerate(span)]
        source = self._result(out, req.source, plan.source_ids, spec.layers, [])
        details = {"source": req.source, "target_positions": list(plan.positions),
                   "source_positions": list(plan.sources), "word": req.targets[0] if req.targets else None}
        return Changes([f"layer {layer}" for layer in span], [float(layer) for layer in span], edits, details, source)

    def _positions(self, selection: Selection, n: int) -> tuple[int, ...] | None:
        """Prompt positions a selection names ('all': None), negative counting from the end."""
        if selection.is_all:
            return None
        return tuple(selection.resolve(n, "position"))

    # -- generation and the description ------------------------------------------------------------
    def _generate(self, req, ids, edits, deadline: float) -> tuple[str, list[str]]:
        """The text generated without and with each change (the same seed), each a part of one engine request
        (in flight together, taking turns with everyone else's); one readout row, so each costs little more
        than the generation itself."""
        info, service = self.service.info, self.service
        spec = dataclasses.replace(planning.lens_spec(ids, [info.n_layers - 1], 1, ("logit",), info.n_layers, []),
                                   read_prompt=False)
        seed = req.seed if req.seed is not None else 0
        sampling = Sampling(req.new_tokens, float(req.temperature), seed)
        specs = [dataclasses.replace(spec, edits=tuple(change)) for change in [[]] + edits]
        texts = [service.prompts.text(out.token_ids) for out in service.engine.generate_all(specs, sampling, deadline)]
        return texts[0], texts[1:]

    def _checkpoint(self) -> CheckpointWeights:
        if self._weights is None:
            model = self.service.model
            try:
                self._weights = CheckpointWeights(model.path, model.family)
            except WeightsNotFound as e:
                raise RequestError(f"this model's weights cannot be read for a direction ({e})") from None
        return self._weights

"""A lens request read: its prompts planned together (layers, targets, the work budget), run in flight together,
and each prompt's result cached on its own, so a comparison's prompt is exactly what `lens` gives for it alone.
"""

from __future__ import annotations

import dataclasses

from .. import jlens as jlens_files
from ..config import MAX_CONTINUATION_TOKENS, PUNCTUATION_WIDTH
from ..lens_kinds import read_by
from ..results import LensResult
from . import components, cost, planning
from .asks import HOST, Ask
from .requests import LensRequest


class Reader:
    """The service's lens readouts (`service`: a `LensService`, used through its public methods)."""

    def __init__(self, service):
        self.service = service

    def plan(self, req: LensRequest, max_prompts: int, read_from: int = 0) -> planning.Plan:
        """Every prompt's layers, ids, targets and spec, and what they cost together, or RequestError.
        read_from: unembed positions read_from.. only (one prompt)."""
        s = self.service
        planning.check_prompt_count(len(req.prompts), max_prompts)
        names = read_by(req.lens)
        layers = planning.lens_layers(req.layers, names, s.info.n_layers, s.jlens_layers)
        ids = [s.prompts.ids(p, req.chat) for p in req.prompts]
        # Each prompt's targets as the model would write them after it (prompts.py: `word`).
        targets = [s.prompts.words(req.targets, i) if req.targets else [] for i in ids]
        target_ids = [[list(t.token_ids) for t in mine] for mine in targets]
        between = components.sublayer_part(s) if req.sublayers else ""      # the logit lens between attn and MLP
        if read_from and not (len(ids) == 1 and 0 < read_from < len(ids[0])):
            raise ValueError(f"read_from {read_from} is not a position of one prompt ({[len(i) for i in ids]} tokens)")
        work = sum((cost.readout(len(i), len(layers), len(names) + bool(between),
                                 [len(t) for t in tids if 1 < len(t) <= MAX_CONTINUATION_TOKENS],
                                 s.cfg.limits.part_cells, read_positions=len(i) - read_from)
                    for i, tids in zip(ids, target_ids)), cost.NOTHING)
        s.check_cost(work, "this request")
        # Skipping punctuation widens the top-k the worker reads (bounded) so a word can be found in it.
        k = max(req.k, PUNCTUATION_WIDTH) if req.skip_punctuation else req.k
        specs = [dataclasses.replace(planning.lens_spec(i, layers, k, names, s.info.n_layers, s.jlens_layers,
                                                        tids, req.raw), after_attention=between, read_from=read_from)
                 for i, tids in zip(ids, target_ids)]
        return planning.Plan(names, layers, ids, specs, work, targets,
                             [planning.continuation_index(t) for t in target_ids])

    def read(self, req: LensRequest, max_prompts: int, read_from: int = 0, ask: Ask = HOST) -> list[LensResult]:
        """Every requested lens, layer and position for each prompt; the prompts no cache holds run together.
        read_from: one prompt's positions read_from.. only, the others blank (`LensResult.read_from`), unless
        its whole readout is cached: then that."""
        s = self.service
        plan = self.plan(req, max_prompts)
        keys = [(p, req.chat, plan.lenses, tuple(plan.layers), req.k, req.targets, req.raw, req.skip_punctuation)
                + (("sublayers",) if req.sublayers else ()) for p in req.prompts]
        # The whole readout when it is done; else the part, even while the whole is being computed (a link's
        # prefetch reads the part, then the whole: its page must not wait for the whole).
        if read_from and s.holds("lens", keys[0], finished=True):
            read_from = 0
        if read_from:
            plan = self.plan(req, max_prompts, read_from)
            keys = [keys[0] + (("from", read_from),)]

        def compute(todo: list[int]) -> list[LensResult]:
            with s.admitted(plan.cost, ask):
                outputs = s.engine.lens([plan.specs[i] for i in todo], s.deadline(plan.cost), ask.client)
            return [LensResult.from_output(out, prompt=req.prompts[i], ids=plan.ids[i], layers=plan.layers,
                                           decode=s.prompts.decode, targets=plan.targets[i],
                                           continuation_of=plan.continuation_of[i], model=s.info.name,
                                           jlens=self.jlens_note(plan.ids[i]), k=req.k,
                                           skip_punctuation=req.skip_punctuation, read_from=read_from)
                    for i, out in zip(todo, outputs)]

        return s.cached_many("lens", keys, compute, pin=ask.pin)

    def jlens_note(self, ids: list[int]) -> dict | None:
        """The lens's description for a result, with a warning when the prompt starts unlike the fitted ones."""
        s = self.service
        if s.jlens is None:
            return None
        note = s.jlens.describe()      # with the lens's own warnings (another model, other releases), if any
        warning = jlens_files.bos_warning(jlens_files.fitted_with_bos(s.jlens, s.prompts.bos_id is not None), ids,
                                         s.prompts.bos_id)
        return note | {"warnings": note.get("warnings", []) + [warning]} if warning else note

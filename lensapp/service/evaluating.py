"""How good is each lens: the evaluation of a set of items (results/evaluation.py says what is scored).

`plan` turns an `EvaluateRequest` into the engine's terms, with every check and no engine call: the items of the
split (a shipped set; with `files`, the command line's, a file of the published form: `evaluation_items.py`), and
per item one `LensSpec` per group of lenses that read the same layers (the logit lens every layer, the Jacobian
lens the layers it has J for, plus the last; the shipped lens has every layer, so one spec reads both). A spec's
targets are the first tokens of the item's intermediates, of its control (`control_of`: another item's
intermediates) and of its target, each word as the model would write it after the prompt (prompts.py: `word`),
scored at every cell; k is 1; it reads the prompt's last position only
(`LensSpec.read_from`), so the whole evaluation costs items x layers x lenses cells and each prompt's forward
(`cost.last_positions`). Each lens reads the prompt as every tab does (with BOS first where the Jacobian lens
was fitted so: prompts.py's one rule).

`run` carries it out in batches that each fit the work budget (`max_work`), each admitted and paid for as it
starts. A shipped set's answer is computed once per model and lens and pinned in the result cache (never
evicted): the page and the API can ask only for the shipped sets' few splits, so a crowd of clicks costs one
evaluation, and identical clicks in flight share it. Being everyone's, it runs in the host's turn (`turns.py`:
its one forward per item in flight together, not a visitor's two at a time), as the front page's examples do;
whoever asks first pays for it. A file's answer is cached as any result is.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..lens_kinds import LENSES, reads_jlens
from ..results.evaluation import EvaluationResult
from . import cost, planning
from .asks import HOST, Ask
from .evaluation_items import EvalItem, ItemSet, item_set
from .requests import EvaluateRequest

ADVICE = "evaluate fewer items (a smaller file, or one split)"


@dataclass(frozen=True)
class Group:
    """Lenses read by one spec per item: the same layers."""

    lenses: tuple[str, ...]
    layers: tuple[int, ...]


@dataclass(frozen=True)
class Plan:
    """source: where the items came from; items: the split's; specs[i]: item i's, one per group; n_intermediates
    [i], n_controls[i]: how many first tokens of its intermediates, then of its control, its targets are (the
    target's last); batches: item index ranges, each within the work budget; cost: the whole evaluation's."""

    source: ItemSet
    split: str
    items: tuple[EvalItem, ...]
    groups: tuple[Group, ...]
    specs: tuple[tuple, ...]
    n_intermediates: tuple[int, ...]
    n_controls: tuple[int, ...]
    batches: tuple[tuple[int, int], ...]
    batch_costs: tuple[cost.Cost, ...]
    cost: cost.Cost

    def key(self) -> tuple:
        """What decides the answer besides the model and the lens (the service's cache key adds those)."""
        return (self.source.label, self.source.digest, self.split, self.groups)


def lens_groups(service) -> tuple[Group, ...]:
    """Every loaded lens, grouped by the layers it reads."""
    n, loaded = service.info.n_layers, service.jlens is not None
    wanted = [(x.name, tuple(x.layers(n, service.jlens_layers))) for x in LENSES.values() if x.available(loaded)]
    groups: dict[tuple[int, ...], list[str]] = {}
    for name, layers in wanted:
        groups.setdefault(layers, []).append(name)
    return tuple(Group(tuple(names), layers) for layers, names in groups.items())


def plan(service, req: EvaluateRequest, files: bool = False) -> Plan:
    """The evaluation in the engine's terms, every check made (RequestError), no engine call."""
    source = item_set(req.items, files)
    items = source.split(req.split)
    groups = lens_groups(service)
    n, jlens_layers = service.info.n_layers, service.jlens_layers
    ids = [service.prompts.ids(x.prompt) for x in items]
    words = [[t.token_ids[0] for t in service.prompts.words((*x.intermediates, x.target), i)]
             for x, i in zip(items, ids)]
    first, target = [w[:-1] for w in words], [w[-1] for w in words]
    specs, counts, controls, costs = [], [], [], []
    for i in range(len(items)):
        control = control_of(first, target, i)
        scored = [[t] for t in (*first[i], *control, target[i])]
        per_item, work = [], cost.NOTHING
        for g in groups:
            spec = planning.lens_spec(ids[i], list(g.layers), 1, g.lenses, n, jlens_layers, target_ids=scored)
            per_item.append(dataclasses.replace(spec, read_from=len(ids[i]) - 1))
            work = work + cost.last_positions([len(ids[i])], len(g.layers), len(g.lenses),
                                              service.cfg.limits.part_cells)
        specs.append(tuple(per_item))
        counts.append(len(first[i]))
        controls.append(len(control))
        costs.append(work)
    batches, batch_costs = _batches(service, costs)
    return Plan(source, req.split, items, groups, tuple(specs), tuple(counts), tuple(controls), batches,
                batch_costs, sum(costs, cost.NOTHING))


def control_of(first: list[list[int]], target: list[int], i: int) -> list[int]:
    """Item i's control: the first tokens of the intermediates of the next item (cyclically) that shares none of
    them, nor its target's (France's item gets Italy's): what the lens reads for *an* intermediate of the same
    kind that is not this item's. A lens that ranks every country high hits its control as often as the item;
    one that reads the item's own beats it. Empty when no item qualifies (a one-item file)."""
    mine = set(first[i]) | {target[i]}
    for d in range(1, len(first)):
        other = first[(i + d) % len(first)]
        if not mine & set(other):
            return list(other)
    return []


def _batches(service, costs: list[cost.Cost]) -> tuple[tuple[tuple[int, int], ...], tuple[cost.Cost, ...]]:
    """Consecutive items in batches that each fit the work budget (an item that alone does not: RequestError)."""
    budget = service.cfg.limits.max_work
    weight = service.token_weight
    batches, totals, start, total = [], [], 0, cost.NOTHING
    for i, c in enumerate(costs):
        service.check_cost(c, f"item {i} of this evaluation", ADVICE)
        if i > start and (total + c).units(weight) > budget:
            batches.append((start, i))
            totals.append(total)
            start, total = i, cost.NOTHING
        total = total + c
    batches.append((start, len(costs)))
    totals.append(total)
    return tuple(batches), tuple(totals)


def run(service, req: EvaluateRequest, files: bool = False, ask: Ask = HOST) -> EvaluationResult:
    """The evaluation's result: a shipped set's pinned in the result cache, a file's cached as any result."""
    p = plan(service, req, files)
    if p.source.shipped:            # bounded and shared by everyone: the app's own work (the host's turn), kept
        host_turn = dataclasses.replace(ask, client=None)
        return service.cached("evaluate", p.key(), lambda: compute(service, p, host_turn), pin=True)
    return service.cached("evaluate", p.key(), lambda: compute(service, p, ask), pin=ask.pin)


def compute(service, p: Plan, ask: Ask = HOST) -> EvaluationResult:
    """Every batch through the engine, for `ask`, then the result."""
    ranks: dict[str, list] = {name: [] for g in p.groups for name in g.lenses}
    for (start, stop), work in zip(p.batches, p.batch_costs):
        specs = [spec for i in range(start, stop) for spec in p.specs[i]]
        with service.admitted(work, ask):          # a batch the engine refuses is given back
            outs = iter(service.engine.lens(specs, service.deadline(work), ask.client))
        for _ in range(start, stop):
            for g in p.groups:
                out = next(outs)
                for name in g.lenses:
                    ranks[name].append(out.readouts[name]["target_ranks"][:, -1])     # [L, targets]
    layers = {name: list(g.layers) for g in p.groups for name in g.lenses}
    jlens = service.jlens.describe()["source"] if service.jlens is not None and reads_jlens(ranks) else None
    return EvaluationResult.from_ranks(ranks, layers, list(p.n_intermediates), list(p.n_controls),
                                       model=service.info.name,
                                       items=p.source.label, split=p.split, names=[x.name for x in p.items],
                                       prompts=[x.prompt for x in p.items], targets=[x.target for x in p.items],
                                       intermediates=[list(x.intermediates) for x in p.items], jlens=jlens)

"""Describe a cell in words (Patchscopes, Ghandeharioun et al. 2024): the lens says which token a hidden state
is closest to; here the model itself says what the state holds.

Block L's output at position P of the prompt is read in one forward (every described layer at once: `kept`
cells), then copied over block `inspect_layer`'s output at the inspection prompt's last token (the
placeholder) in that prompt's first forward only, and the model goes on greedily. The default inspection
prompt is the paper's identity prompt: a few "x -> x" pairs, then the placeholder, so the model repeats
what the state stands for. `inspect_layer` is L itself unless asked otherwise.

A sweep over layers (`--layer all`) reads the prompt once and sends one generation per layer as the parts of
one engine request, in flight together (bench/describe_speed.py: against one request per layer).

Prefix caching is off in this app (engine/run/vllm_backend.py: `PREFIX_CACHING`). It matters here: every
generation of a sweep has the same inspection prompt, and a prefix cache would serve the second one the
first one's cached keys and values, computed with another state at the placeholder (or none). Were it
turned on, the backend salts every request that carries edits (`cache_salt`), these among them.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from ..engine.run.edit import Edit
from ..engine.run.protocol import LensSpec, Sampling
from ..lens_kinds import LOGIT
from ..results.description import Description, Descriptions
from ..results.readout import in_context
from . import cost, planning
from .asks import HOST, Ask
from .requests import DescribeRequest
from .selection import index

# The paper's identity prompt: the placeholder is its last token ("?"); what follows it is the model's word for it.
IDENTITY_PROMPT = "cat -> cat; 1135 -> 1135; hello -> hello; ?"


class DescribePlan(NamedTuple):
    ids: list[int]                   # the prompt's tokens
    position: int                    # the described position, counted from 0
    layers: list[int]                # the described layers, ascending
    inspection_prompt: str
    inspect_ids: list[int]
    inspect_layers: list[int]        # per described layer: the block of the inspection prompt that takes its state
    cost: cost.Cost


class Describer:
    """Patchscopes descriptions (`service`: a `LensService`, used through its public methods)."""

    def __init__(self, service):
        self.service = service

    def plan(self, req: DescribeRequest) -> DescribePlan:
        s, n = self.service, self.service.info.n_layers
        ids = s.prompts.ids(req.prompt, req.chat)
        layers = req.layer.resolve(n)
        position = index(req.position, len(ids),
                         f"position {req.position} is outside this {len(ids)}-token prompt (0..{len(ids) - 1})")
        text = req.inspect if req.inspect.strip() else IDENTITY_PROMPT
        inspect_ids = s.prompts.ids(text)
        inspect_layers = layers if req.inspect_layer is None else len(layers) * [index(
            req.inspect_layer, n, f"inspect_layer {req.inspect_layer} is outside this {n}-layer model (0..{n - 1})")]
        work = cost.description(len(ids), len(inspect_ids), len(layers), req.max_tokens)
        s.check_cost(work, "this description")
        return DescribePlan(ids, position, layers, text, inspect_ids, inspect_layers, work)

    def run(self, req: DescribeRequest, ask: Ask = HOST) -> Descriptions:
        s = self.service
        plan = self.plan(req)
        parts = (req.prompt, req.chat, tuple(plan.layers), plan.position, req.max_tokens, plan.inspection_prompt,
                 tuple(plan.inspect_layers))
        items = s.cached("describe", parts, lambda: self.describe(req, plan, ask), pin=ask.pin)
        return Descriptions(items, single=_names_one_layer(req))

    def describe(self, req: DescribeRequest, plan: DescribePlan, ask: Ask = HOST) -> list[Description]:
        """The plan run (no cache): the prompt read once, then one generation per described layer, together."""
        s, n = self.service, self.service.info.n_layers
        read = dataclasses.replace(planning.lens_spec(plan.ids, [n - 1], 1, (LOGIT.name,), n, []),
                                   keep_layers=tuple(plan.layers), keep_positions=(plan.position,))
        source = cost.forward(len(plan.ids), 1, 1)
        placeholder = len(plan.inspect_ids) - 1
        with s.admitted(plan.cost, ask):
            kept = s.engine.lens([read], s.deadline(source), ask.client)[0].kept.cpu()       # [len(layers), 1, d_model]
            specs = [LensSpec(input_ids=tuple(plan.inspect_ids), read_layers=(n - 1,), rows=(0,), k=1,
                              lenses=(LOGIT.name,), read_prompt=False,
                              edits=(Edit(layer, "replace", kept[i].float(), positions=(placeholder,)),))
                     for i, layer in enumerate(plan.inspect_layers)]
            outs = s.engine.generate_all(specs, Sampling(req.max_tokens), s.deadline(plan.cost), ask.client)
        source_token = in_context(s.prompts.decode, plan.ids)[plan.position]
        return [Description(prompt=req.prompt, layer=layer, position=plan.position, source_token=source_token,
                            inspection_prompt=plan.inspection_prompt, inspect_layer=inspect_layer,
                            inspect_position=placeholder, token_ids=list(out.token_ids),
                            tokens=in_context(s.prompts.decode, out.token_ids), text=s.prompts.text(out.token_ids),
                            model=s.info.name)
                for layer, inspect_layer, out in zip(plan.layers, plan.inspect_layers, outs)]


def _names_one_layer(req: DescribeRequest) -> bool:
    """The request names one layer (`--layer 12`, `last`): its answer is one object, not a list."""
    parts = req.layer.parts
    return len(parts) == 1 and (isinstance(parts[0], int) or parts[0] == "last")

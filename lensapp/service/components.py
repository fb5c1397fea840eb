"""Who wrote the answer: a `ComponentsRequest` planned, run and made a `ComponentsResult`.

The plan needs no engine (the CLI asks it before vLLM starts): the family must be one whose blocks are
known (`engine/run/anatomy.py`: one line otherwise), the position and the patterns' layer must fit, the target
and foil are the first tokens of their words as the model would write them after the prompt's tokens up to the
position (prompts.py: `word`), and the cost (one forward,
and a layer's heads x positions^2 attention weights when asked: `cost.components`) must fit the budget.
The engine reads everything in one trace of the prompt (`engine/run/components_trace.py`).
"""

from __future__ import annotations

from typing import NamedTuple

from ..engine.run.anatomy import anatomy_of, refusal
from ..engine.run.protocol import ComponentsSpec
from ..results import ComponentsResult, Target
from . import cost
from .asks import HOST, Ask
from .field import RequestError, show
from .requests import ComponentsRequest
from .selection import index

ADVICE = "choose an earlier position, leave out the patterns, or a shorter prompt"


class ComponentsPlan(NamedTuple):
    req: ComponentsRequest
    ids: list[int]
    position: int
    target: Target
    foil: Target | None
    patterns_layer: int | None
    spec: ComponentsSpec
    cost: cost.Cost


def model_shape(hf_config) -> tuple[int, int]:
    """(attention heads, head size) from an HF config."""
    n_heads = int(hf_config.num_attention_heads)
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // n_heads
    return n_heads, int(head_dim)


def unavailable(service) -> str | None:
    """Why this service's model cannot have its components read (one line), or None when it can."""
    model_type = getattr(getattr(service.model, "hf_config", None), "model_type", None)
    engine = getattr(getattr(service, "cfg", None), "engine", None)
    return refusal(str(model_type), getattr(engine, "pipeline_parallel_size", 1))


def plan(service, req: ComponentsRequest) -> ComponentsPlan:
    """Every check the request gets before any engine: RequestError with one line."""
    model, info = service.model, service.info
    why = unavailable(service)
    if why:
        raise RequestError(why)
    ids = service.prompts.ids(req.prompt, req.chat)
    position = resolve(req.position, len(ids), "position", "the prompt's positions")
    target, *rest = service.prompts.words([req.target, *([req.foil] if req.foil.strip() else [])], ids[:position + 1])
    foil = rest[0] if rest else None
    if foil is not None and foil.token_ids[0] == target.token_ids[0]:
        raise RequestError(f"the target {req.target!r} and the foil {req.foil!r} start with the same token: "
                           "their difference is zero")
    layer = None if req.patterns is None else resolve(req.patterns, info.n_layers, "patterns layer", "the layers")
    n_heads, head_dim = model_shape(model.hf_config)
    work = cost.components(len(ids), n_heads, 0 if layer is None else position + 1)
    service.check_cost(work, "this components readout", ADVICE)
    spec = ComponentsSpec(input_ids=tuple(ids), position=position, target_id=target.token_ids[0],
                          n_layers=info.n_layers, model_type=model.hf_config.model_type, head_dim=head_dim,
                          foil_id=None if foil is None else foil.token_ids[0], patterns_layer=layer,
                          norm_plus_one=model.family.norm_plus_one)
    return ComponentsPlan(req, ids, position, target, foil, layer, spec, work)


def sublayer_part(service) -> str:
    """Where a lens with sublayers reads each block's MLP part (`LensSpec.after_attention`), or RequestError
    when this model's blocks are not known."""
    why = unavailable(service)
    if why:
        raise RequestError(why.replace("attention and MLP contributions are", "the lens between attention and MLP "
                                       "is"))
    return anatomy_of(service.model.hf_config.model_type).mlp_part


def resolve(i: int, n: int, noun: str, of: str) -> int:
    """An index counted from 0 (negative: from the end) in 0..n-1, or RequestError."""
    return index(i, n, f"{noun} {show(i)} is outside {of} (0..{n - 1}, or -{n}..-1 from the end)")


def run(service, p: ComponentsPlan, ask: Ask = HOST) -> ComponentsResult:
    """The components readout a plan asks for, for `ask` (identical plans computed once: the service's cache)."""
    req = p.req
    with service.admitted(p.cost, ask):
        out = service.engine.components(p.spec, service.deadline(p.cost), ask.client)
    return ComponentsResult.from_output(out, prompt=req.prompt, ids=p.ids, position=p.position, target=p.target,
                                        foil=p.foil, decode=service.prompts.decode, patterns_layer=p.patterns_layer,
                                        model=service.info.name)

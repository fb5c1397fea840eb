"""A generation read at every step, and a chat reply read at one layer: planned, run and cached.

A plan is the same for a check (the CLI asks before an engine starts) and a run. A result is cached when the
request is reproducible: greedy decoding, or sampling with an explicit seed. Forced tokens, the branches they
make of a generation or a reply, are `branching.py`'s, which builds on these.
"""

from __future__ import annotations

from ..config import LENS_CHOICES
from ..engine.run.protocol import Sampling
from ..results import ChatReply, GenerationResult
from ..results.decided import WIDTH as DECIDED_WIDTH
from . import cost, planning
from .field import RequestError, show
from .requests import ChatRequest, GenerateRequest
from .selection import from_end, span


class Generator:
    """The service's generations and chat replies, without forced tokens (`service`: a `LensService`, used through
    its public methods)."""

    def __init__(self, service):
        self.service = service

    # -- generate ------------------------------------------------------------------------------------------
    def plan(self, req: GenerateRequest) -> planning.Plan:
        """The generation's layers, prompt ids, spec and cost, or RequestError."""
        s = self.service
        names = LENS_CHOICES[req.lens]
        layers = planning.lens_layers(req.layers, names, s.info.n_layers, s.jlens_layers)
        ids = s.prompts.ids(req.prompt, req.chat)
        # The top-5 decision strip (results/decided.py) needs five of each cell's top tokens, whatever k shows.
        k = max(req.k, DECIDED_WIDTH)
        spec = planning.lens_spec(ids, layers, k, names, s.info.n_layers, s.jlens_layers, raw=req.raw)
        work = cost.generation(spec, req.max_tokens, s.cfg.part_cells)
        s.check_cost(work, "this generation")
        return planning.Plan(names, layers, [ids], [spec], work)

    def generate(self, req: GenerateRequest) -> GenerationResult:
        """Generate and read the newest position at every step (step 0: all prompt positions); `req.force` unread."""
        s = self.service
        plan = self.plan(req)
        sampling = sampling_of(req)

        def compute() -> GenerationResult:
            s.admit(plan.cost)
            out = s.engine.generate(plan.specs[0], sampling, s.deadline(plan.cost))
            return GenerationResult.from_output(out, prompt=req.prompt, ids=plan.ids[0], layers=plan.layers,
                                                decode=s.prompts.decode, text=s.prompts.text(out.token_ids),
                                                model=s.info.name, seed=req.seed, temperature=req.temperature,
                                                k=req.k)

        if not reproducible(sampling):
            return compute()
        return s.cached("generate", (req.prompt, req.chat, plan.lenses, tuple(plan.layers), req.k, req.max_tokens,
                                     sampling.decides, req.raw), compute)

    # -- chat ----------------------------------------------------------------------------------------------
    def chat_plan(self, req: ChatRequest) -> tuple[int, list[int], int]:
        """(the readout's layer, the conversation's ids, the oldest turns dropped to fit), or RequestError."""
        s = self.service
        pool = s.chat_layers(req.lens)
        n = s.info.n_layers
        layer = planning.default_chat_layer(pool, n) if req.layer is None else from_end(req.layer, n)
        if layer not in pool:
            raise RequestError(f"the chat readout cannot read layer {show(layer)}; choose one of {span(pool)}")
        conversation = s.prompts.conversation(list(req.messages))
        return layer, conversation.ids, conversation.dropped_turns

    def chat(self, req: ChatRequest) -> ChatReply:
        """Answer a conversation with a per-token readout of one lens at one layer; `req.force` unread."""
        s = self.service
        layer, ids, dropped = self.chat_plan(req)
        spec = planning.lens_spec(ids, [layer], req.k, LENS_CHOICES[req.lens], s.info.n_layers, s.jlens_layers)
        sampling = sampling_of(req)
        work = cost.chat(len(ids), req.max_tokens)
        s.check_cost(work, "this chat")

        def compute() -> ChatReply:
            s.admit(work)
            out = s.engine.chat(spec, sampling, s.deadline(work))
            return ChatReply.from_output(out, decode=s.prompts.decode, text=s.prompts.text(out.token_ids),
                                         lens=req.lens, layer=layer, dropped_turns=dropped)

        if not reproducible(sampling):
            return compute()
        return s.cached("chat", (tuple((m["role"], m["content"]) for m in req.messages), req.lens, layer,
                                 req.max_tokens, req.k, sampling.decides), compute)


def sampling_of(req: GenerateRequest | ChatRequest, max_tokens: int | None = None) -> Sampling:
    """How the request's tokens are chosen (`max_tokens`: how many, when not the request's own)."""
    return Sampling(req.max_tokens if max_tokens is None else max_tokens, float(req.temperature), req.seed)


def reproducible(sampling: Sampling) -> bool:
    """Greedy decoding, or sampling with an explicit seed: the same request gives the same answer."""
    return sampling.greedy or sampling.seed is not None

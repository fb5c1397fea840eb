"""A generation read at every step, and a chat reply read at one layer: planned, run and cached.

A plan is the same for a check (the CLI asks before an engine starts) and a run. A result is cached when the
request is reproducible: greedy decoding, or sampling with an explicit seed. Forced tokens, the branches they
make of a generation or a reply, are `branching.py`'s, which builds on these.

Either may be streamed (`generate_stream`, `chat_stream`): a `Partial` for each step as the engine hands it out
(engine/run/step_stream.py), then the result, exactly the one-shot path's (and cached as it is). A stream closed
before its end stops the engine's work and keeps nothing. Either pays for the steps it made (`made`): a generation
stopped after one token, or ended by the model before its last, gives back what its other steps were planned to cost.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, NamedTuple

from ..engine.run.protocol import ChatOutput, LensSpec, Sampling
from ..engine.run.step_stream import Step
from ..lens_kinds import read_by
from ..results import ChatReply, GenerationResult
from ..results.decided import WIDTH as DECIDED_WIDTH
from ..results.generation import GrowingChat, GrowingGeneration
from . import cost, planning
from .asks import HOST, Ask
from .field import RequestError, show
from .requests import ChatRequest, GenerateRequest
from .selection import from_end, span


@dataclass
class Partial:
    """A streamed request's newest step as it arrives: its index, the text written so far, the step (a
    `GenerationStep`; a chat's {"token_id", "token", "readout"}) and `so_far()`, the result so far (made when
    asked: a page redraws at its own rate, not at every step). Never cached, never whole."""

    index: int
    text: str
    step: Any
    so_far: Callable[[], GenerationResult | ChatReply]

    def to_json(self) -> dict:
        """The step as a stream's frame: {"frame": "step", "step", "text", and the step's own keys}."""
        body = self.step.to_json() if hasattr(self.step, "to_json") else dict(self.step)
        return {"frame": "step", "step": self.index, "text": self.text, **body}


class ChatWork(NamedTuple):
    layer: int
    dropped: int                             # the oldest turns left out to fit
    spec: LensSpec
    sampling: Sampling
    cost: cost.Cost
    reply: Callable[[ChatOutput], ChatReply]     # the reply of the engine's output
    steps: Callable[[int], cost.Cost]            # what it costs once n tokens are written (n = max_tokens: `cost`)


class Generator:
    """The service's generations and chat replies, without forced tokens (`service`: a `LensService`, used through
    its public methods)."""

    def __init__(self, service):
        self.service = service

    # -- generate ------------------------------------------------------------------------------------------
    def plan(self, req: GenerateRequest) -> planning.Plan:
        """The generation's layers, prompt ids, spec and cost, or RequestError."""
        s = self.service
        names = read_by(req.lens)
        layers = planning.lens_layers(req.layers, names, s.info.n_layers, s.jlens_layers)
        ids = s.prompts.ids(req.prompt, req.chat)
        # The top-5 decision strip (results/decided.py) needs five of each cell's top tokens, whatever k shows.
        k = max(req.k, DECIDED_WIDTH)
        spec = planning.lens_spec(ids, layers, k, names, s.info.n_layers, s.jlens_layers, raw=req.raw)
        work = cost.generation(spec, req.max_tokens, s.cfg.limits.part_cells)
        s.check_cost(work, "this generation")
        return planning.Plan(names, layers, [ids], [spec], work)

    def generate(self, req: GenerateRequest, ask: Ask = HOST) -> GenerationResult:
        """Generate and read the newest position at every step (step 0: all prompt positions); `req.force` unread."""
        s = self.service
        plan = self.plan(req)
        sampling = sampling_of(req)

        def compute() -> GenerationResult:
            out = None
            with s.admitted(plan.cost, ask, made(self._steps(plan), lambda: len(out.token_ids))):
                out = s.engine.generate(plan.specs[0], sampling, s.deadline(plan.cost), ask.client)
            return self._result(req, plan, out)

        if not reproducible(sampling):
            return compute()
        return s.cached("generate", self._key(req, plan, sampling), compute, pin=ask.pin)

    def generate_stream(self, req: GenerateRequest, ask: Ask = HOST) -> Iterator[Partial | GenerationResult]:
        """`generate`, streamed: a Partial per step as it is done, then the result (`generate`'s, cached as it is)."""
        s = self.service
        plan = self.plan(req)
        sampling = sampling_of(req)

        def stream() -> Iterator[Partial | GenerationResult]:
            growing = GrowingGeneration(prompt=req.prompt, ids=plan.ids[0], layers=plan.layers, decode=s.prompts.decode,
                                        model=s.info.name, seed=req.seed, temperature=req.temperature, k=req.k)
            with s.admitted(plan.cost, ask, made(self._steps(plan), lambda: len(growing.token_ids))):
                for item in s.engine.generate_steps(plan.specs[0], sampling, s.deadline(plan.cost), ask.client):
                    yield (grown(growing, item, s.prompts.text) if isinstance(item, Step) else
                           self._result(req, plan, item))

        if not reproducible(sampling):
            return stream()
        return s.cached_stream("generate", self._key(req, plan, sampling), stream)

    def _result(self, req: GenerateRequest, plan: planning.Plan, out) -> GenerationResult:
        s = self.service
        return GenerationResult.from_output(out, prompt=req.prompt, ids=plan.ids[0], layers=plan.layers,
                                            decode=s.prompts.decode, text=s.prompts.text(out.token_ids),
                                            model=s.info.name, seed=req.seed, temperature=req.temperature, k=req.k)

    def _steps(self, plan: planning.Plan) -> Callable[[int], cost.Cost]:
        """What the plan's generation costs once it has written n tokens (its cost as planned for n = max_tokens)."""
        return lambda n: cost.generation(plan.specs[0], n, self.service.cfg.limits.part_cells)

    @staticmethod
    def _key(req: GenerateRequest, plan: planning.Plan, sampling: Sampling) -> tuple:
        return (req.prompt, req.chat, plan.lenses, tuple(plan.layers), req.k, req.max_tokens, sampling.decides, req.raw)

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

    def chat(self, req: ChatRequest, ask: Ask = HOST) -> ChatReply:
        """Answer a conversation with a per-token readout of one lens at one layer; `req.force` unread."""
        s = self.service
        w = self._chat_work(req)

        def compute() -> ChatReply:
            out = None
            with s.admitted(w.cost, ask, made(w.steps, lambda: len(out.token_ids))):
                out = s.engine.chat(w.spec, w.sampling, s.deadline(w.cost), ask.client)
            return w.reply(out)

        if not reproducible(w.sampling):
            return compute()
        return s.cached("chat", chat_key(req, w.layer, w.sampling), compute, pin=ask.pin)

    def chat_stream(self, req: ChatRequest, ask: Ask = HOST) -> Iterator[Partial | ChatReply]:
        """`chat`, streamed: a Partial per token as it is written, then the reply (`chat`'s, cached as it is)."""
        s = self.service
        w = self._chat_work(req)

        def stream() -> Iterator[Partial | ChatReply]:
            growing = GrowingChat(decode=s.prompts.decode, lens=req.lens, layer=w.layer, dropped_turns=w.dropped)
            with s.admitted(w.cost, ask, made(w.steps, lambda: len(growing.token_ids))):
                for item in s.engine.chat_steps(w.spec, w.sampling, s.deadline(w.cost), ask.client):
                    yield grown(growing, item, s.prompts.text) if isinstance(item, Step) else w.reply(item)

        if not reproducible(w.sampling):
            return stream()
        return s.cached_stream("chat", chat_key(req, w.layer, w.sampling), stream)

    def _chat_work(self, req: ChatRequest) -> ChatWork:
        """What a chat request runs, or RequestError."""
        s = self.service
        layer, ids, dropped = self.chat_plan(req)
        spec = planning.lens_spec(ids, [layer], req.k, read_by(req.lens), s.info.n_layers, s.jlens_layers)
        work = cost.chat(len(ids), req.max_tokens)
        s.check_cost(work, "this chat")

        def reply(out) -> ChatReply:
            return ChatReply.from_output(out, decode=s.prompts.decode, text=s.prompts.text(out.token_ids),
                                         lens=req.lens, layer=layer, dropped_turns=dropped)
        return ChatWork(layer, dropped, spec, sampling_of(req), work, reply, lambda n: cost.chat(len(ids), n))


def chat_key(req: ChatRequest, layer: int, sampling: Sampling) -> tuple:
    return (tuple((m["role"], m["content"]) for m in req.messages), req.lens, layer, req.max_tokens, req.k,
            sampling.decides)


def made(steps: Callable[[int], cost.Cost], written: Callable[[], int]) -> Callable[[], cost.Cost]:
    """What a generation has run (its engine work paid for: `LensService.admitted`) once `written()` tokens are
    written: `steps(n)`, and at least its first step (its prompt's forward and readout, the heavy part, under way
    from the moment the engine let it in: a stream can be closed only after that, at a step it handed out)."""
    return lambda: steps(max(1, written()))


def grown(growing: GrowingGeneration | GrowingChat, step: Step, text: Callable[[list[int]], str],
          offset: int = 0) -> Partial:
    """`step` added to what is growing, as a Partial (`offset`: the index of the growing part's first step)."""
    read = growing.add(step.token_id, step.readout)
    ids = list(growing.token_ids)
    return Partial(offset + step.index, text(ids), read, lambda: growing.so_far(text(ids), len(ids)))


def sampling_of(req: GenerateRequest | ChatRequest, max_tokens: int | None = None) -> Sampling:
    """How the request's tokens are chosen (`max_tokens`: how many, when not the request's own)."""
    return Sampling(req.max_tokens if max_tokens is None else max_tokens, float(req.temperature), req.seed)


def reproducible(sampling: Sampling) -> bool:
    """Greedy decoding, or sampling with an explicit seed: the same request gives the same answer."""
    return sampling.greedy or sampling.seed is not None

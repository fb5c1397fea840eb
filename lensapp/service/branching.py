"""Forced tokens: a generation (or a chat reply) branched at a step, and a branch branched again.

`force` [(step, token)] on a generate or chat request names the tokens put in place of what the model said,
earliest first: a token id, or a word, read as the model would write it after the text so far (the prompt and
the tokens kept before the step: prompts.py's `word`, its first token), so it is resolved when that text is
known, as its branch grows. The generation without them (the trunk) is computed as ever (and cached when it is
reproducible); then, for each force in turn, the branch so far keeps its tokens before the step and their
readouts, takes the forced token, and the model goes on from prompt + kept tokens + forced token as a new
request with the same settings and seed, which reads only the forced token's position and its own new
tokens (`LensSpec.read_from`): the prefix's other readouts are the parent's, never recomputed. So a branch's
continuation is exactly the generation of (prefix + forced token) with the same seed, and costs what that
generation's new tokens cost, not its prefix's readout (`cost.branch`; measured in bench/branch_speed.py).

Each branch so far is cached under its forces, so a page that branches a branch computes only the new part.
A sampled generation (temperature > 0) needs a seed: without one the tokens before the forced step would be
a new sample each time, and no branch would continue what the page shows.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator, NamedTuple

from ..engine.run.protocol import LensSpec, Sampling
from ..engine.run.step_stream import Step
from ..lens_kinds import read_by
from ..results import ChatReply, GenerationResult
from ..results.branching import graft, graft_chat
from ..results.generation import GrowingGeneration
from . import cost, planning
from .asks import HOST, Ask
from .field import RequestError
from .generating import Generator, Partial, made, sampling_of
from .requests import ChatRequest, GenerateRequest


class BranchPlan(NamedTuple):
    forces: tuple[tuple[int, int | str], ...]     # (step, token id or word), earliest first
    cost: cost.Cost                           # the trunk's and every continuation's, at most


class Brancher:
    """Forced tokens: the branches they make of `generator`'s generations and replies (`service`: a `LensService`,
    used through its public methods)."""

    def __init__(self, service, generator: Generator):
        self.service, self.generator = service, generator

    # -- generate ------------------------------------------------------------------------------------------
    def plan(self, req: GenerateRequest) -> BranchPlan:
        """The forces checked and what the whole costs (the trunk as if it were not cached), or RequestError."""
        s = self.service
        self._check_seeded(req.sampled, req.seed)
        base = self.generator.plan(req)
        forces = self._checked(req.force, req.max_tokens)
        work = base.cost
        for step, _ in forces:
            work = work + cost.branch(len(base.ids[0]) + step + 1, req.max_tokens - step - 1, len(base.layers),
                                      len(base.lenses))
        s.check_cost(work, "this generation and its branches")
        return BranchPlan(forces, work)

    def generate(self, req: GenerateRequest, ask: Ask = HOST) -> GenerationResult:
        plan = self.plan(req)
        return self._branch(dataclasses.replace(req, force=()), plan.forces, ask)

    def _branch(self, trunk: GenerateRequest, forces: tuple, ask: Ask) -> GenerationResult:
        """The generation `trunk` asks for with `forces` made, each branch on the way cached."""
        s = self.service
        if not forces:
            return self.generator.generate(trunk, ask)
        return s.cached("branch", self._key(trunk, forces), lambda: self._grow(trunk, forces, ask), pin=ask.pin)

    def _key(self, trunk: GenerateRequest, forces: tuple) -> tuple:
        plan = self.generator.plan(trunk)
        return (trunk.prompt, trunk.chat, plan.lenses, tuple(plan.layers), trunk.k, trunk.max_tokens,
                sampling_of(trunk).decides, trunk.raw, forces)

    def _grow(self, trunk: GenerateRequest, forces: tuple, ask: Ask) -> GenerationResult:
        s = self.service
        fork = self._fork(trunk, forces, ask)
        continuation = out = None
        if fork.spec is not None:
            with s.admitted(fork.cost, ask, made(fork.steps, lambda: len(out.token_ids))):
                out = s.engine.generate(fork.spec, fork.sampling, s.deadline(fork.cost), ask.client)
            continuation = fork.continuation(out)
        return fork.grafted(continuation)

    def generate_stream(self, req: GenerateRequest, ask: Ask = HOST) -> Iterator[Partial | GenerationResult]:
        """`generate`, streamed: the branches before the last computed whole (and cached); then the last one's
        steps, those it keeps of its parent and its forced token at once, its continuation as it is written."""
        plan = self.plan(req)
        trunk, forces = dataclasses.replace(req, force=()), plan.forces
        return self.service.cached_stream("branch", self._key(trunk, forces),
                                          lambda: self._grow_stream(trunk, forces, ask))

    def _grow_stream(self, trunk: GenerateRequest, forces: tuple, ask: Ask) -> Iterator[Partial | GenerationResult]:
        s = self.service
        fork = self._fork(trunk, forces, ask)
        kept = fork.grafted(None)
        for i in range(fork.step + 1):
            text = s.prompts.text(kept.token_ids[:i + 1])
            yield Partial(i, text, kept.steps[i], lambda i=i, text=text: _first(kept, i + 1, text))
        continuation = None
        if fork.spec is not None:
            growing = fork.growing()
            with s.admitted(fork.cost, ask, made(fork.steps, lambda: len(growing.token_ids))):
                for item in s.engine.generate_steps(fork.spec, fork.sampling, s.deadline(fork.cost), ask.client):
                    if isinstance(item, Step):
                        read = growing.add(item.token_id, item.readout)
                        n = len(growing.token_ids)
                        yield Partial(fork.step + 1 + item.index, s.prompts.text(kept.token_ids + growing.token_ids),
                                      read, lambda n=n: fork.grafted(growing.so_far("", n)))
                    else:
                        continuation = fork.continuation(item)
        yield fork.grafted(continuation)

    def _fork(self, trunk: GenerateRequest, forces: tuple, ask: Ask) -> Fork:
        """The last force's branch as it will be made: its parent (every earlier branch, computed whole and cached),
        the forced token, and the request that continues from it (None: nothing follows)."""
        s = self.service
        parent = self._branch(trunk, forces[:-1], ask)
        step, word = forces[-1]
        _check_step(step, len(parent.token_ids), "generation")
        plan = self.generator.plan(trunk)
        token = s.prompts.forced(word, plan.ids[0] + parent.token_ids[:step], s.info.vocab_size)
        prefix = plan.ids[0] + parent.token_ids[:step] + [token]
        n_new = 0 if token in s.prompts.stop_ids else trunk.max_tokens - step - 1
        # Prefix caching is off in this app (engine/run/vllm_backend.py): the prefix's forward is recomputed,
        # not its readouts. Were it on, this request could reuse the parent's KV cache for the prefix, as it should.
        spec = dataclasses.replace(plan.specs[0], input_ids=tuple(prefix), read_from=len(prefix) - 1)
        return Fork(s, trunk, plan, parent, step, token, prefix, spec if n_new > 0 else None,
                    sampling_of(trunk, n_new), cost.branch(len(prefix), n_new, len(plan.layers), len(plan.lenses)))

    # -- chat ----------------------------------------------------------------------------------------------
    def chat(self, req: ChatRequest, ask: Ask = HOST) -> ChatReply:
        s = self.service
        self._check_seeded(req.sampled, req.seed)
        forces = self._checked(req.force, req.max_tokens)
        layer, ids, _ = self.generator.chat_plan(req)
        work = cost.chat(len(ids), req.max_tokens)
        for step, _ in forces:
            work = work + cost.branch(len(ids) + step + 1, req.max_tokens - step - 1, 1, 1)
        s.check_cost(work, "this reply and its branches")
        reply = self.generator.chat(dataclasses.replace(req, force=()), ask)
        for step, word in forces:
            reply = self._grow_chat(req, reply, ids, layer, step, word, ask)
        return reply

    def _grow_chat(self, req: ChatRequest, parent: ChatReply, ids: list[int], layer: int, step: int,
                   word: int | str, ask: Ask) -> ChatReply:
        s = self.service
        _check_step(step, len(parent.token_ids), "reply")
        token = s.prompts.forced(word, ids + parent.token_ids[:step], s.info.vocab_size)
        prefix = ids + parent.token_ids[:step] + [token]
        n_new = 0 if token in s.prompts.stop_ids else req.max_tokens - step - 1
        continuation = None
        if n_new > 0:
            spec = planning.lens_spec(prefix, [layer], req.k, read_by(req.lens), s.info.n_layers,
                                      s.jlens_layers)
            work, out = cost.branch(len(prefix), n_new, 1, 1), None
            with s.admitted(work, ask, made(lambda n: cost.branch(len(prefix), n, 1, 1), lambda: len(out.token_ids))):
                out = s.engine.chat(spec, sampling_of(req, n_new), s.deadline(work), ask.client)
            continuation = ChatReply.from_output(out, decode=s.prompts.decode, text="", lens=req.lens, layer=layer)
        path = parent.token_ids[:step] + [token] + (continuation.token_ids if continuation else [])
        return graft_chat(parent, step, token, continuation, decode=s.prompts.decode, text=s.prompts.text(path))

    # -- shared --------------------------------------------------------------------------------------------
    def _checked(self, force: tuple, max_tokens: int) -> tuple[tuple[int, int | str], ...]:
        """The forces, each step within the generation and each token id within the vocabulary (a word is read
        when the text before it is known: `_grow`)."""
        s = self.service
        for step, word in force:
            if step >= max_tokens:
                raise RequestError(f"force step {step} is past the {max_tokens} tokens generated "
                                   f"(steps 0..{max_tokens - 1})")
            if isinstance(word, int):
                s.prompts.forced(word, (), s.info.vocab_size)
        return tuple(force)

    @staticmethod
    def _check_seeded(sampled: bool, seed: int | None) -> None:
        if sampled and seed is None:
            raise RequestError("forcing a token of a sampled generation needs a seed: without one, the tokens before "
                               "it would be a new sample each time")


class Fork(NamedTuple):
    """A branch's last force as `Brancher._fork` plans it; `spec` None: nothing follows the forced token."""

    service: object
    trunk: GenerateRequest
    plan: planning.Plan
    parent: GenerationResult
    step: int
    token: int
    prefix: list[int]
    spec: LensSpec | None
    sampling: Sampling
    cost: cost.Cost

    def steps(self, n: int) -> cost.Cost:
        """What the continuation costs once it has written n tokens (`cost` for all it may write)."""
        return cost.branch(len(self.prefix), n, len(self.plan.layers), len(self.plan.lenses))

    def growing(self) -> GrowingGeneration:
        s, t = self.service, self.trunk
        return GrowingGeneration(prompt=t.prompt, ids=self.prefix, layers=self.plan.layers, decode=s.prompts.decode,
                                 model=s.info.name, seed=t.seed, temperature=t.temperature, k=t.k,
                                 read_from=len(self.prefix) - 1)

    def continuation(self, out) -> GenerationResult:
        """The continuation's result from the engine's output (its step 0 reads the forced token's position only)."""
        s, t = self.service, self.trunk
        return GenerationResult.from_output(out, prompt=t.prompt, ids=self.prefix, layers=self.plan.layers,
                                            decode=s.prompts.decode, text="", model=s.info.name, seed=t.seed,
                                            temperature=t.temperature, k=t.k, read_from=len(self.prefix) - 1)

    def grafted(self, continuation: GenerationResult | None) -> GenerationResult:
        s = self.service
        ids = self.parent.token_ids[:self.step] + [self.token] + (continuation.token_ids if continuation else [])
        return graft(self.parent, self.step, self.token, continuation, prompt_ids=self.plan.ids[0],
                     decode=s.prompts.decode, text=s.prompts.text(ids))


def _first(result: GenerationResult, n: int, text: str) -> GenerationResult:
    """`result`'s first n steps, `text` theirs (a branch's kept steps, streamed before its continuation)."""
    return dataclasses.replace(result, text=text, token_ids=result.token_ids[:n], tokens=result.tokens[:n],
                               steps=result.steps[:n])


def _check_step(step: int, n: int, what: str) -> None:
    if step >= n:
        raise RequestError(f"force step {step} is past the end of the {what}, which stopped after {n} tokens")

"""The model on engine services (`lensapp engine`, nnsight-serve): the same traces, sent over HTTP.

`RemoteBackend` is the vLLM backend with its engine swapped for a `served.ServedVLLM`: a meta model
(config and tokenizer, no weights) whose traces run on the services, through the pool of them the page was
given (`engines.Engines`: each trace to the least loaded engine that is up, moved to another when one is full
or gone). Every lens, generation and edit is the vLLM backend's own trace (`VLLMBackend.run_lens`,
`run_generate`: the same bodies from `trace.py`), so a readout over the wire is the in-process one. What differs:

- the chat readout is the vLLM backend's per-request trace too (an installed edit would be every page's);
- the Jacobian lens: one engine holds one J stack for every page that uses it. The engine installs its
  own at start (`lensapp engine --jlens`); a page checks each engine's against its own by fingerprint,
  installs its own only where an engine holds none, and is refused, in one line, where one holds another.
  An engine that comes back (restarted) is given the page's stack again before it serves the page (`_admit`);
- liveness: each service is polled (`GET /health`) by its own thread (`Engines.watch`); one that stops
  answering is left out until it answers again, and only when none is up is it this backend's death (the
  engine then reconnects: `served`, `Unreachable`);
- a generation or a chat goes to the service's stream route (`served_stream.py`): streamed (each step on the page
  as it is written, and Stop), the service takes each step from its worker as in-process and writes it at once; the
  page's stream closed closes the request's HTTP stream, and the service aborts it on vLLM. Its tokens come from
  vLLM's own output there, as in-process (the one-shot route's come from the block's end, never reached by a
  generation that ends before its max_tokens). A stream moves to another engine only before its first frame;
- progress (the supervisor's stall watch): `steps` counts the outputs received (one per trace, one per step of a
  streamed one), `cpu_seconds` is the services' vLLM processes' CPU time, read by the same polls; so a
  long generation on a busy service is not taken for a stuck one, and services that neither answer nor
  work while traces wait are;
- an engine whose model differs from the page's (layers, d_model, vocabulary, dtype) is refused, by itself;
- a sampled generation without a seed is given one here (`seeded`), so the trace asked again on another engine
  gives the same tokens.

What stays in the page's process: tokenising, planning, results, the result cache and rate limits (each
page its own), and fitting steering vectors (on the transformers backend, which needs the weights there).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import secrets

from .engines import Engines
from .families import Family
from .protocol import JStack, ModelInfo, Progress, Sampling, StartFailed, Unreachable
from .served import ServedVLLM, ServeTrace, Wire, finished
from .served_stream import StreamKeys, stream_into
from .service_checks import engine_facts, install_stack, mismatch, stack_fingerprint
from .stages import is_last_stage
from .trace import SAVED
from .vllm_backend import VLLMBackend, vllm_head, vllm_site

log = logging.getLogger(__name__)

SEEDS = 1 << 31          # a drawn seed is below this (vLLM takes any int; the page's own seeds are smaller still)


class RemoteBackend(VLLMBackend):
    concurrent = True
    served = True

    def __init__(self, model: ServedVLLM, info: ModelInfo, family: Family):
        # What VLLMBackend's traces read (its __init__ would start an engine here).
        self.model, self.info = model, info
        self.engines: Engines = model.wire
        self.layout = family.vllm_layout()
        self.head = functools.partial(vllm_head, self.layout)
        self.site = vllm_site(self.layout, self.head, info.d_model)
        self.jlens_layers: list[int] = []
        self.steps = 0                                # outputs received, a streamed trace's steps too (`progress`)
        self.courier = StreamKeys()                   # streamed traces' keys: the service writes each step as it comes
        self._stack: tuple[str, bytes] | None = None  # the page's J stack: its fingerprint, and the trace installing it
        self._facts = self._blob(engine_facts)        # built once here: watchers send it from their threads
        refusals = [e for e in self.engines.admit_all(self._admit) if e is not None]
        if not self.engines.any_up():
            if refusals and all(e.permanent and not isinstance(e, Unreachable) for e in refusals):
                raise StartFailed(str(refusals[0]))  # every engine refuses this page: so would they again
            raise Unreachable(self.engines.none_up())    # Unreachable while every service is away
        self.engines.watch(self._admit)
        log.info("connected to the engine service(s) at %s", self.engines.url)

    # -- Backend protocol (run_lens and run_components are VLLMBackend's) --------------------------------------
    async def run_generate(self, spec, sampling: Sampling, sink=None):
        return await super().run_generate(spec, seeded(sampling), sink)

    async def run_chat(self, spec, sampling: Sampling, sink=None):
        return await super().run_chat(spec, seeded(sampling), sink)

    async def install_jlens(self, stack: JStack) -> None:
        """Use each engine's J stack when it is this one; ship this one where an engine holds none. Refused when an
        engine holds another (and then no engine is changed). Engines out now are given it when they come back."""
        mine = stack_fingerprint(stack.layers, stack.J)
        blob = self._blob(install_stack, list(stack.layers), stack.J)     # traced here, on the engine's loop
        await asyncio.to_thread(self._install_everywhere, (mine, blob))
        self.jlens_layers = list(stack.layers)

    async def _saved(self, tracer, with_output: bool = False, sink=None, key: str = ""):
        """VLLMBackend's, a generation or a chat (`with_output`) sent to the service's stream route: its steps into
        `sink` as they come (a streamed one's, `key`), and its tokens from vLLM's own output. The one-shot route
        reads them from the block's last statement, which a generation that ends before its max_tokens never runs."""
        if with_output:
            stream_into(tracer.backend, key, sink)
        return await super()._saved(tracer, with_output, sink, key)

    def progress(self) -> Progress:
        return Progress(self.steps, self.engines.progress())

    def failure(self) -> str | None:
        return self.engines.failure()

    def is_dead(self, error: BaseException) -> str | None:
        return str(error) if isinstance(error, Unreachable) else None

    def close(self) -> None:
        """Stop watching the services (they, and their engines, live on)."""
        engines = getattr(self, "engines", None)
        if engines is not None:
            engines.stop()

    # -- each engine's facts and lens ------------------------------------------------------------------------
    def _admit(self, wire: Wire) -> None:
        """An engine may serve this page: its model is the page's, and it holds the page's J stack (given it
        here if it holds none). StartFailed (the engine refused, in one line) or Unreachable otherwise. Run under
        `engines.admitting`."""
        facts = self._ask(wire, self._facts)
        problem = mismatch(facts, self.info)
        if problem:
            raise StartFailed(f"{problem} (at {wire.url})")
        if self._stack is not None:
            self._give_stack(wire, facts["jlens"], self._stack)

    def _install_everywhere(self, stack: tuple[str, bytes]) -> None:
        with self.engines.admitting:
            held: dict[Wire, str] = {}
            for replica in self.engines.replicas:
                if replica.up:
                    try:
                        held[replica.wire] = self._ask(replica.wire, self._facts)["jlens"]
                    except Unreachable as e:           # gone since: its watcher gives it the stack when it is back
                        self.engines.leave_out(replica, str(e))
            for wire, fingerprint in held.items():
                if fingerprint and fingerprint != stack[0]:
                    raise StartFailed(self._another(wire, fingerprint, stack[0]))
            for wire, fingerprint in held.items():
                self._give_stack(wire, fingerprint, stack)
            self._stack = stack
        self.engines.health()                          # Unreachable when none took it

    def _give_stack(self, wire: Wire, held: str, stack: tuple[str, bytes]) -> None:
        mine, blob = stack
        if held == mine:
            return
        if held:
            raise StartFailed(self._another(wire, held, mine))
        held = self._ask(wire, blob)["jlens"]
        if held != mine:                               # another page installed its own at the same moment
            raise StartFailed(f"another page installed its Jacobian lens on the engine service at {wire.url} "
                              f"({held}) as this one did; one engine serves one lens")

    @staticmethod
    def _another(wire: Wire, held: str, mine: str) -> str:
        return (f"the engine service at {wire.url} holds another Jacobian lens (fingerprint {held}; this page's is "
                f"{mine}): one engine serves one lens to every page, so start the engine with this page's --jlens, "
                "or the page with the engine's")

    def _blob(self, body, *args) -> bytes:
        """A one-step trace running `body(model, site, *args)` (a function the engine imports by reference) and
        saving what it returns, serialized, not sent: `_ask` sends it to one engine, from any thread (building a
        trace is nnsight's, on one thread; sending bytes is not)."""
        import nnsight

        model, site = self.model, self.site
        with model.trace([0], backend=ServeTrace(self.engines), temperature=0.0, max_tokens=1, edits=[]) as tracer:
            out = body(model, site, *args)
            if is_last_stage():
                saved = nnsight.save(out)              # noqa: F841 - read back by `_ask`
        return tracer.backend.blob

    @staticmethod
    def _ask(wire: Wire, blob: bytes) -> dict:
        """What a `_blob` trace saved, run on the engine at `wire` (waiting here)."""
        return finished(*wire.post(blob)).saves[SAVED]


def seeded(sampling: Sampling) -> Sampling:
    """A sampled generation with its seed drawn here when it has none: asked again on another engine (its first
    gone under it), it gives the same tokens. Greedy decoding needs none."""
    if sampling.greedy or sampling.seed is not None:
        return sampling
    return dataclasses.replace(sampling, seed=secrets.randbelow(SEEDS))


class ServedStart:
    """The engine's start function for a page on engine services: the meta model is built at the first start
    (seconds) and kept; every start after a loss of the services connects again with it, through the same pool
    (its counts kept: `describe`, for /health)."""

    def __init__(self, path: str, info: ModelInfo, family: Family, engines: Engines):
        self.path, self.info, self.family, self.engines = path, info, family, engines
        self.model: ServedVLLM | None = None

    def __call__(self) -> RemoteBackend:
        if self.model is None:
            self.model = ServedVLLM(self.path, wire=self.engines, dtype=self.info.dtype,
                                    max_model_len=self.info.max_model_len)
        return RemoteBackend(self.model, self.info, self.family)

    def describe(self) -> dict:
        """Each engine service: its address, up or not, and its requests (in flight, answered, moved off it)."""
        return {"engines": self.engines.describe()}


def served_backend_factory(path: str, info: ModelInfo, family: Family, engines: Engines) -> ServedStart:
    return ServedStart(path, info, family, engines)

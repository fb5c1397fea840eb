"""The model on an engine service (`lensapp engine`, nnsight-serve): the same traces, sent over HTTP.

`RemoteBackend` is the vLLM backend with its engine swapped for a `served.ServedVLLM`: a meta model
(config and tokenizer, no weights) whose traces run on the service. Every lens, generation and edit is
the vLLM backend's own trace (`VLLMBackend.run_lens`, `run_generate`: the same bodies from `trace.py`),
so a readout over the wire is the in-process one. What differs:

- the chat readout is the vLLM backend's per-request trace too (an installed edit would be every page's);
- the Jacobian lens: one engine holds one J stack for every page that uses it. The engine installs its
  own at start (`lensapp engine --jlens`); a page checks the engine's against its own by fingerprint,
  installs its own only where the engine holds none, and is refused, in one line, where the engine holds
  another;
- liveness: the service is polled (`GET /health`) in a thread; a service that stops answering is this
  backend's death, and the engine reconnects (`served`, `Unreachable`) as soon as it answers again;
- a generation or a chat goes to the service's stream route (`served_stream.py`): streamed (each step on the page
  as it is written, and Stop), the service takes each step from its worker as in-process and writes it at once; the
  page's stream closed closes the request's HTTP stream, and the service aborts it on vLLM. Its tokens come from
  vLLM's own output there, as in-process (the one-shot route's come from the block's end, never reached by a
  generation that ends before its max_tokens);
- progress (the supervisor's stall watch): `steps` counts the outputs received (one per trace, one per step of a
  streamed one), `cpu_seconds` is the service's vLLM processes' CPU time, read by the same poll; so a
  long generation on a busy service is not taken for a stuck one, and a service that neither answers nor
  works while traces wait is;
- a page whose model differs from the engine's (layers, d_model, vocabulary, dtype) is refused at connect.

What stays in the page's process: tokenising, planning, results, the result cache and rate limits (each
page its own), and fitting steering vectors (on the transformers backend, which needs the weights there).
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Callable

from .families import Family
from .protocol import JStack, ModelInfo, Progress, StartFailed, Unreachable
from .served import ServedVLLM, Wire
from .served_stream import StreamKeys, stream_into
from .service_checks import engine_facts, mismatch, stack_fingerprint
from .stages import is_last_stage
from .trace import SAVED
from .vllm_backend import VLLMBackend, vllm_head, vllm_site

log = logging.getLogger(__name__)

POLL_SECONDS = 2.0       # between two looks at the service's /health
MISSES = 2               # polls in a row that must fail before the service counts as gone


class RemoteBackend(VLLMBackend):
    concurrent = True
    served = True

    def __init__(self, model: ServedVLLM, info: ModelInfo, family: Family):
        # What VLLMBackend's traces read (its __init__ would start an engine here).
        self.model, self.info = model, info
        self.layout = family.vllm_layout()
        self.head = functools.partial(vllm_head, self.layout)
        self.site = vllm_site(self.layout, self.head, info.d_model)
        self.jlens_layers: list[int] = []
        self.steps = 0                                # outputs received, a streamed trace's steps too (`progress`)
        self.courier = StreamKeys()                   # streamed traces' keys: the service writes each step as it comes
        model.wire.health()                           # Unreachable while the service is away
        facts = self._facts()
        problem = mismatch(facts, info)
        if problem:
            raise StartFailed(problem)
        self.engine_jlens = facts["jlens"]
        self._liveness = Liveness(model.wire)
        log.info("connected to the engine service at %s (%s)", model.wire.url, facts)

    # -- Backend protocol (run_lens, run_generate and run_chat are VLLMBackend's) -------------------------------
    async def install_jlens(self, stack: JStack) -> None:
        """Use the engine's J stack when it is this one; ship this one where the engine holds none."""
        mine = stack_fingerprint(stack.layers, stack.J)
        held = (await self._afacts())["jlens"]
        if held != mine:
            if held:
                raise StartFailed(f"the engine service holds another Jacobian lens (fingerprint {held}; this page's "
                                  f"is {mine}): one engine serves one lens to every page, so start the engine with "
                                  "this page's --jlens, or the page with the engine's")
            await super().install_jlens(stack)
            held = (await self._afacts())["jlens"]
            if held != mine:                           # another page installed its own at the same moment
                raise StartFailed(f"another page installed its Jacobian lens on the engine service ({held}) "
                                  "as this one did; one engine serves one lens")
        self.engine_jlens = held
        self.jlens_layers = list(stack.layers)

    async def _saved(self, tracer, with_output: bool = False, sink=None, key: str = ""):
        """VLLMBackend's, a generation or a chat (`with_output`) sent to the service's stream route: its steps into
        `sink` as they come (a streamed one's, `key`), and its tokens from vLLM's own output. The one-shot route
        reads them from the block's last statement, which a generation that ends before its max_tokens never runs."""
        if with_output:
            stream_into(tracer.backend, key, sink)
        return await super()._saved(tracer, with_output, sink, key)

    def progress(self) -> Progress:
        return Progress(self.steps, self._liveness.cpu_seconds)

    def failure(self) -> str | None:
        return self._liveness.failure

    def is_dead(self, error: BaseException) -> str | None:
        return str(error) if isinstance(error, Unreachable) else None

    def close(self) -> None:
        """Stop watching the service (the service, and its engine, live on)."""
        liveness = getattr(self, "_liveness", None)
        if liveness is not None:
            liveness.stop()

    # -- the engine's facts ---------------------------------------------------------------------------
    def _facts(self) -> dict:
        """engine_facts, read now (sent at the block's exit: this runs off the engine's loop, at start)."""
        import nnsight

        model, site = self.model, self.site
        with model.trace([0], sync=True, temperature=0.0, max_tokens=1, edits=[]) as tracer:
            out = engine_facts(model, site)
            if is_last_stage():
                saved = nnsight.save(out)              # noqa: F841 - read back below
        return tracer.backend.output.saves[SAVED]

    async def _afacts(self) -> dict:
        return await self._saved(self._trace([0], engine_facts))


class Liveness:
    """A thread that looks at the service's /health every POLL_SECONDS; `failure` says why it is gone, and
    `cpu_seconds` what its vLLM processes have spent so far (read at the same look)."""

    def __init__(self, wire: Wire):
        self.wire, self.failure, self.cpu_seconds = wire, None, 0.0
        self._stopped = threading.Event()
        threading.Thread(target=self._watch, name="lens-engine-service-liveness", daemon=True).start()

    def _watch(self) -> None:
        misses = 0
        while not self._stopped.wait(POLL_SECONDS):
            try:
                self.wire.health()
            except (Unreachable, StartFailed) as e:
                misses += 1
                if misses >= MISSES and self.failure is None:
                    self.failure = str(e)
                    log.error("the engine service is gone: %s", e)
                continue
            misses = 0
            try:
                self.cpu_seconds = self.wire.progress()
            except (Unreachable, StartFailed) as e:     # gone since: the next look at /health says so
                log.debug("the engine service's progress: %s", e)

    def stop(self) -> None:
        self._stopped.set()


def served_backend_factory(path: str, info: ModelInfo, family: Family, wire: Wire) -> Callable[[], RemoteBackend]:
    """The engine's start function: the meta model is built at the first start (seconds) and kept; every
    start after a loss of the service connects again with it."""
    model: ServedVLLM | None = None

    def start() -> RemoteBackend:
        nonlocal model
        if model is None:
            model = ServedVLLM(path, wire=wire, dtype=info.dtype, max_model_len=info.max_model_len)
        return RemoteBackend(model, info, family)
    return start

"""The model on an engine service (`lensapp engine`, nnsight-serve): the same traces, sent over HTTP.

`RemoteBackend` is the vLLM backend with its engine swapped for a `served.ServedVLLM`: a meta model
(config and tokenizer, no weights) whose traces run on the service. Every lens, generation and edit is
the vLLM backend's own trace (`VLLMBackend.run_lens`, `run_generate`: the same bodies from `trace.py`),
so a readout over the wire is the in-process one. What differs:

- the chat readout: the vLLM backend installs it once with `model.edit()`, which on a shared engine
  would be every page's at once (and a plain `generate` has no serve path); here it is a per-request
  trace like a generation's;
- the Jacobian lens: one engine holds one J stack for every page that uses it. The engine installs its
  own at start (`lensapp engine --jlens`); a page checks the engine's against its own by fingerprint,
  installs its own only where the engine holds none, and is refused, in one line, where the engine holds
  another;
- liveness: the service is polled (`GET /health`) in a thread; a service that stops answering is this
  backend's death, and the engine reconnects (`served`, `Unreachable`) as soon as it answers again;
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
from .protocol import ChatOutput, JStack, LensSpec, ModelInfo, Sampling, StartFailed, Unreachable
from .served import ServedVLLM, Wire
from .service_checks import engine_facts, mismatch, stack_fingerprint
from .stages import gather_head_shards, is_last_stage, runs_here
from .trace import SAVED, Site, chat_readout
from .vllm_backend import VLLMBackend, _sampling, _saved, vllm_head

log = logging.getLogger(__name__)

POLL_SECONDS = 2.0       # between two looks at the service's /health
MISSES = 2               # polls in a row that must fail before the service counts as gone


class RemoteBackend(VLLMBackend):
    concurrent = True
    served = True

    def __init__(self, model: ServedVLLM, info: ModelInfo, family: Family):
        # What VLLMBackend's traces read (its __init__ would start an engine here).
        self.model, self.info = model, info
        self.layout = family.layout("vllm")
        self.head = functools.partial(vllm_head, self.layout)
        self.site = Site(self.layout, self.head, info.d_model, vllm=True, gather=gather_head_shards,
                         last_stage=is_last_stage, runs_here=runs_here)
        self.jlens_layers: list[int] = []
        model.wire.health()                           # Unreachable while the service is away
        facts = self._facts()
        problem = mismatch(facts, info)
        if problem:
            raise StartFailed(problem)
        self.engine_jlens = facts["jlens"]
        self._liveness = Liveness(model.wire)
        log.info("connected to the engine service at %s (%s)", model.wire.url, facts)

    # -- Backend protocol (run_lens and run_generate are VLLMBackend's) -------------------------------
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

    async def run_chat(self, spec: LensSpec, sampling: Sampling) -> ChatOutput:
        """The chat readout as the request's own trace (an installed edit would be every page's)."""
        import nnsight

        spec.check_chat()
        layer, jrow = spec.layers[0], spec.jlens_rows[0] if spec.jlens_rows else None
        model, site = self.model, self.site
        with model.trace(list(spec.input_ids), edits=[], **_sampling(sampling)) as tracer:
            saved = nnsight.save({"readout": []})      # noqa: F841 - read back by `_saved`
            for _ in tracer.iter[:sampling.max_tokens]:
                ids, probs = chat_readout(model, site, layer, jrow, spec.k)
                saved["readout"].append((ids.tolist(), probs.tolist()))
        saved, last = await _saved(tracer, with_output=True)
        ids = list(last.outputs[0].token_ids)
        steps = saved["readout"][:len(ids)]
        return ChatOutput(token_ids=ids, top_ids=[list(map(int, i)) for i, _ in steps],
                          top_probs=[list(map(float, p)) for _, p in steps])

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
        return await _saved(self._trace([0], engine_facts))


class Liveness:
    """A thread that looks at the service's /health every POLL_SECONDS; `failure` says why it is gone."""

    def __init__(self, wire: Wire):
        self.wire, self.failure = wire, None
        self._stopped = threading.Event()
        threading.Thread(target=self._watch, name="lens-engine-service-liveness", daemon=True).start()

    def _watch(self) -> None:
        misses = 0
        while not self._stopped.wait(POLL_SECONDS):
            try:
                self.wire.health()
                misses = 0
            except (Unreachable, StartFailed) as e:
                misses += 1
                if misses >= MISSES and self.failure is None:
                    self.failure = str(e)
                    log.error("the engine service is gone: %s", e)

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

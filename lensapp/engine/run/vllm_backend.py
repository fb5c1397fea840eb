"""The model in vLLM through nnsight (`VLLM(..., dispatch=True, mode="async")`): GPU, or CPU via `vllm_cpu`.

Every request is its own trace, submitted to vLLM's async engine, which batches whatever is in
flight step by step (continuous batching): several users' generations share each decode step, and
a short lens request that arrives during a long generation joins the next step instead of
waiting for the generation to end. The trace bodies (`trace.py`) run in the engine's worker, so
everything vocab-wide stays there; only small tensors come back.

The Jacobian matrices are installed in the worker once (`install_jlens`) and read from the
model object by each request. Nothing else is installed: every readout, the chat's included, runs in
its own request's trace, so no request can change what another reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging

from .components_trace import components_trace
from .courier import Courier
from .errors import one_line
from .families import Family, find
from .outbox import publish
from .process_log import LOG
from .protocol import (
    ChatOutput,
    ComponentsOutput,
    ComponentsSpec,
    GenerationOutput,
    JStack,
    LensOutput,
    LensSpec,
    ModelInfo,
    Progress,
    Sampling,
    StartFailed,
)
from .site import Site
from .stages import (
    gather_head_shards,
    gather_heads,
    is_last_stage,
    project_local,
    runs_here,
    tp_rank,
    unembedding_rows,
)
from .trace import JLENS_ATTR, SAVED, chat_readout, continuation_trace, lens_body, lens_trace
from .unembed_pool import worker_pool

log = logging.getLogger(__name__)

GPU_MEMORY_SHARE = 0.85        # on a GPU, vLLM's share of its memory (weights, KV cache, activations)
# vLLM's prefix cache stays off: a request that edits the stream (an intervention, a Patchscopes description, whose
# sweep sends the same inspection prompt with a different state at its placeholder each time) must never be served
# another request's cached keys and values for the same tokens. Should it ever be turned on, every request with edits
# is salted (`_prompt`), so it shares no cache with any other.
PREFIX_CACHING = False


def vllm_head(layout, model, x):
    """The family's unembedding as vLLM applies it (soft-capping, logit scale; gathered under TP)."""
    return model.logits_processor(find(model, layout.head), x)


def sampler_logits(model, layout):
    """The logits vLLM's sampler reads, at the last position [vocab] (the family's arithmetic applied)."""
    return model.logits[-1]


def vllm_site(layout, head, d_model: int) -> Site:
    """How a trace reaches a vLLM worker's model: the sampler's logits, the head split by vocab rows and the
    heads by rank under tensor parallelism, pipeline stages, weights packed for the CPU, attention weights
    recomputed (vLLM's kernels never form them). The engine service's page side uses the same."""
    return Site(layout, head, d_model, logits=sampler_logits, gather=gather_head_shards, last_stage=is_last_stage,
                runs_here=runs_here, rows=unembedding_rows, gather_heads=gather_heads, project=project_local,
                rank=tp_rank, recompute_attention=True)


class VLLMBackend:
    """nnsight's VLLM in async mode: `vllm`, the class the loader chose (nnsight's own, or on CPU the worker
    adapter, `engine/start/vllm_cpu.py`, its processes' environment already prepared).

    `kv_cache_bytes`: the KV cache vLLM gets (engine/start/memory.py sizes it on CPU); 0 lets vLLM size it
    from `gpu_memory_utilization` (on CPU, a share of the NUMA node's memory).
    """

    concurrent = True            # vLLM batches every call in flight, step by step

    def __init__(self, path: str, info: ModelInfo, family: Family, *, vllm: type, max_model_len: int,
                 gpu_memory_utilization: float, kv_cache_bytes: int = 0, tensor_parallel_size: int = 1,
                 pipeline_parallel_size: int = 1, distributed_executor_backend: str = ""):
        extra = {"distributed_executor_backend": distributed_executor_backend} if distributed_executor_backend else {}
        if kv_cache_bytes:
            extra["kv_cache_memory_bytes"] = kv_cache_bytes
        LOG.capture()                           # what vLLM's processes print names a failure's cause
        self._log_mark = LOG.mark()
        try:
            self.model = vllm(path, dispatch=True, mode="async", dtype=info.dtype, max_model_len=max_model_len,
                             gpu_memory_utilization=gpu_memory_utilization or GPU_MEMORY_SHARE,
                             tensor_parallel_size=tensor_parallel_size, pipeline_parallel_size=pipeline_parallel_size,
                             enable_prefix_caching=PREFIX_CACHING, disable_log_stats=True, **extra)
        except Exception as e:
            cause = LOG.cause(since=self._log_mark)
            # With a cause printed, the same start would meet it again; without one (a process killed), retry.
            raise StartFailed(cause or one_line(e), permanent=cause is not None) from e
        self.info = info
        self.layout = family.vllm_layout()
        self.head = functools.partial(vllm_head, self.layout)
        self.site = vllm_site(self.layout, self.head, info.d_model)
        self.jlens_layers: list[int] = []
        self.steps = 0                    # outputs streamed back, one per engine step of each request (`progress`)
        # streamed requests' steps, taken from the worker as they are done
        self.courier: Courier | None = Courier(lambda *a, **kw: self.model.vllm_entrypoint.collective_rpc(*a, **kw))

    # -- Backend protocol ---------------------------------------------------------------------------
    async def install_jlens(self, stack: JStack) -> None:
        """Ship the J stack [n, d, d] to the worker once; later requests index into it there. Under pipeline
        parallelism only the last stage, where every readout runs (`stages`), keeps it."""
        import nnsight

        model, payload = self.model, {"layers": list(stack.layers), "J": stack.J}
        with model.trace([0], temperature=0.0, max_tokens=1, edits=[]) as tracer:
            target = model._module
            device = next(target.parameters()).device
            if is_last_stage():
                setattr(target, JLENS_ATTR, {"layers": payload["layers"], "J": payload["J"].to(device)})
            saved = nnsight.save({"installed": True})       # noqa: F841 - read back by `_saved`
        if not (await self._saved(tracer))["installed"]:
            raise RuntimeError("installing the Jacobian lens in the worker failed")
        self.jlens_layers = list(stack.layers)

    async def run_lens(self, spec: LensSpec) -> LensOutput:
        """The prompt's trace and one per multi-token target, all in flight at once."""
        spec.check(self.info.n_layers, self.info.d_model)
        tracers = [self._trace(_prompt(spec.input_ids, spec.edits), lens_trace, spec)]
        tracers += [self._trace(_prompt(c.input_ids, spec.edits), continuation_trace, spec, i)
                    for i, c in enumerate(spec.continuations)]
        saved = await asyncio.gather(*(self._saved(t) for t in tracers))
        return LensOutput(readouts=saved[0]["readouts"], model_next_id=saved[0]["model_next_id"],
                          continuations=[s["logprobs"] for s in saved[1:]], kept=saved[0].get("kept"),
                          norms=saved[0].get("norms"), after_attention=saved[0].get("after_attention"))

    async def run_generate(self, spec: LensSpec, sampling: Sampling, sink=None) -> GenerationOutput:
        """Greedy or seeded sampling with a readout (and the spec's edits) at every step; streamed into `sink`, each
        step is also published in the worker, where the courier takes it from."""
        import nnsight

        spec.check(self.info.n_layers, self.info.d_model)
        model, site = self.model, self.site
        key = self.courier.open(sink) if sink is not None and self.courier is not None else ""
        with model.trace(_prompt(spec.input_ids, spec.edits), edits=[], **_sampling(sampling)) as tracer:
            saved = nnsight.save({"steps": []})          # noqa: F841 - read back by `_saved`
            pool = worker_pool(model._module)
            for step in tracer.iter[:sampling.max_tokens]:
                out = lens_body(model, spec, site, own_logits=True, pool=pool, step=step)
                saved["steps"].append(out)
                if key and site.last_stage():
                    publish(model, key, step, out)
        saved, last = await self._saved(tracer, with_output=True, sink=sink, key=key)
        ids = list(last.outputs[0].token_ids)
        return GenerationOutput(token_ids=ids, steps=list(saved["steps"])[:len(ids)])

    async def run_chat(self, spec: LensSpec, sampling: Sampling, sink=None) -> ChatOutput:
        """Generate with the chat readout (one lens at one layer, the newest position) in this request's own
        trace: two chats with different layers, lenses or k in one batch each read their own."""
        import nnsight

        spec.check_chat()
        model, site = self.model, self.site
        layer, jrow = spec.layers[0], spec.jlens_rows[0] if spec.jlens_rows else None
        key = self.courier.open(sink) if sink is not None and self.courier is not None else ""
        with model.trace(list(spec.input_ids), edits=[], **_sampling(sampling)) as tracer:
            saved = nnsight.save({"readout": []})        # noqa: F841 - read back by `_saved`
            for step in tracer.iter[:sampling.max_tokens]:
                out = chat_readout(model, site, layer, jrow, spec.k, spec.lenses[0])
                saved["readout"].append(out)
                if key and site.last_stage():
                    publish(model, key, step, out)
        saved, last = await self._saved(tracer, with_output=True, sink=sink, key=key)
        ids = list(last.outputs[0].token_ids)
        steps = list(saved["readout"])[:len(ids)]
        return ChatOutput(token_ids=ids, top_ids=[[int(i) for i in top_ids] for top_ids, _ in steps],
                          top_probs=[[float(p) for p in top_probs] for _, top_probs in steps])

    async def run_components(self, spec: ComponentsSpec) -> ComponentsOutput:
        """The prompt's components readout in its own trace (`components`)."""
        spec.check(self.info.n_layers)
        return ComponentsOutput(**await self._saved(self._trace(spec.input_ids, components_trace, spec)))

    def progress(self) -> Progress:
        return Progress(self.steps, engine_cpu_seconds())

    def failure(self) -> str | None:
        llm = self.model.vllm_entrypoint
        if llm is None:
            return "the engine is closed"
        return self._death("vLLM's engine process stopped") if llm.errored else None

    def is_dead(self, error: BaseException) -> str | None:
        from vllm.v1.engine.exceptions import EngineDeadError

        return self._death("vLLM's engine process died") if isinstance(error, EngineDeadError) else None

    def _death(self, what: str) -> str:
        """`what`, with the last error vLLM's processes printed since this backend started, if any."""
        cause = LOG.cause(since=self._log_mark)
        return f"{what} ({cause})" if cause else what

    def close(self) -> None:
        """Shut vLLM's EngineCore and worker processes down (they outlive a SIGTERM otherwise)."""
        llm = getattr(self.model, "vllm_entrypoint", None)
        if llm is None:
            return
        try:
            llm.shutdown(timeout=10)
        except Exception as e:  # noqa: BLE001 - already gone
            log.debug("engine shutdown: %s", e)
        self.model.vllm_entrypoint = None

    # -- traces ---------------------------------------------------------------------------------------
    async def _saved(self, tracer, with_output: bool = False, sink=None, key: str = ""):
        """The dict a trace saved under `SAVED`, once vLLM has finished the request (and the finished
        RequestOutput, `with_output`), counting each step's output as it streams; the tokens so far into `sink`, and
        the courier asked for the steps published under `key`. A trace that saved nothing under that name fails
        here, by name."""
        last = None
        try:
            async with contextlib.aclosing(tracer.backend.__aiter__()) as stream:    # closed at once if cancelled
                async for output in stream:
                    self.steps += 1
                    last = output
                    if sink is not None:
                        sink.tokens(output.outputs[0].token_ids)
                    if key:
                        self.courier.kick()
        finally:
            if key:
                self.courier.close(key)
        if last is None or SAVED not in last.saves:
            raise RuntimeError(f"the trace saved no {SAVED!r} (it saved {sorted(last.saves) if last else []})")
        return (last.saves[SAVED], last) if with_output else last.saves[SAVED]

    def _trace(self, input_ids, body, *args):
        """Submit a one-step trace of `input_ids` running `body(model, site, *args)` (a `trace.*_trace`
        function, so it pickles by reference) and saving the dict it returns; `_saved` reads it back."""
        import nnsight

        model, site = self.model, self.site
        with model.trace(input_ids, temperature=0.0, max_tokens=1, edits=[]) as tracer:
            out = body(model, site, *args)
            if is_last_stage():            # an earlier pipeline stage reads no readout: it saves nothing
                saved = nnsight.save(out)      # noqa: F841 - read back by `_saved`
        return tracer


def _prompt(input_ids, edits) -> list[int] | dict:
    """The prompt as vLLM takes it: its ids; with edits while prefix caching is on, salted (see PREFIX_CACHING)."""
    if PREFIX_CACHING and edits:
        import uuid

        return {"prompt_token_ids": list(input_ids), "cache_salt": uuid.uuid4().hex}
    return list(input_ids)


def engine_cpu_seconds() -> float:
    """CPU time spent by vLLM's processes under this one (EngineCore and its workers: vLLM names them VLLM::...)."""
    import psutil

    total = 0.0
    for p in psutil.Process().children(recursive=True):
        try:
            if p.name().startswith("VLLM::"):
                times = p.cpu_times()
                total += times.user + times.system
        except psutil.Error:                 # gone while listed
            continue
    return total


def _sampling(s: Sampling) -> dict:
    kwargs = {"temperature": 0.0 if s.greedy else float(s.temperature), "max_tokens": int(s.max_tokens)}
    if s.seed is not None:
        kwargs["seed"] = int(s.seed)
    return kwargs

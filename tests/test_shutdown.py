"""SIGTERM while the app starts: it stops, and no vLLM process outlives it (`server.Stopping`).

`python app.py` on the embedded model, signalled as soon as the port answers (before the engine starts), as
the engine starts (the page still being built), and (extended) once vLLM's EngineCore exists. Each starts an
app of its own: a minute or two.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest
from conftest import REPO, _free_port

pytestmark = [pytest.mark.slow, pytest.mark.engine]


def start_app(tmp_path):
    port = _free_port()
    env = {**os.environ, "GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port),
           "GRADIO_ANALYTICS_ENABLED": "False"}
    log = tmp_path / "app.log"
    proc = subprocess.Popen([sys.executable, "app.py", "--jlens", "none"], cwd=REPO, env=env,
                            stdout=open(log, "w"), stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}/", log


def stop_and_collect(proc, log, seen: dict) -> None:
    """SIGTERM `proc`; it must exit 0 within 5 minutes, and every process it ever had must be gone."""
    proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        note_children(proc.pid, seen)               # what it starts while stopping counts too
        time.sleep(0.2)
    if proc.poll() is None:
        proc.kill()
        pytest.fail(f"the app did not exit within 300 s of SIGTERM:\n{log.read_text()[-3000:]}")
    _, alive = psutil.wait_procs(list(seen.values()), timeout=30)
    for p in alive:
        p.kill()
    assert not alive, f"outlived the app: {[(p.pid, p.name()) for p in alive]}\n{log.read_text()[-3000:]}"
    assert proc.returncode == 0, log.read_text()[-3000:]


def note_children(pid: int, seen: dict) -> None:
    try:
        for p in psutil.Process(pid).children(recursive=True):
            seen.setdefault(p.pid, p)
    except psutil.Error:
        pass


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "health", timeout=2):
            return True
    except OSError:
        return False


@pytest.mark.extended      # CI's 25 minutes: the handler-first rule stays in CI (SIGTERM before the engine starts)
def test_sigterm_as_the_engine_starts_stops_it_and_leaves_no_process(tmp_path):
    """Signalled as the memory plan is logged: the engine starts right after it, and the page is built
    for seconds more. (Before the handler came first, the signal killed the process then, orphaning any
    vLLM process, or, once the handler was in but the server not yet made, was lost: the app served on.)"""
    proc, url, log = start_app(tmp_path)
    seen: dict = {}
    deadline = time.monotonic() + 300
    while "memory plan:" not in log.read_text():
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"no memory plan within 300 s:\n{log.read_text()[-3000:]}"
        time.sleep(0.02)
    note_children(proc.pid, seen)
    stop_and_collect(proc, log, seen)


def test_sigterm_before_the_engine_starts_stops_at_once(tmp_path):
    proc, url, log = start_app(tmp_path)
    seen: dict = {}
    deadline = time.monotonic() + 120
    while not answers(url):                                      # the starting page: imports still under way
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)
    note_children(proc.pid, seen)
    stop_and_collect(proc, log, seen)
    assert not any("EngineCore" in _name(p) for p in seen.values())         # it never got that far


@pytest.mark.extended
def test_sigterm_while_vllm_starts_leaves_no_process(tmp_path):
    proc, url, log = start_app(tmp_path)
    seen: dict = {}
    deadline = time.monotonic() + 300
    while not any("EngineCore" in _name(p) for p in seen.values()):
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"no EngineCore within 300 s:\n{log.read_text()[-3000:]}"
        note_children(proc.pid, seen)
        time.sleep(0.1)
    assert "the model is ready" not in log.read_text()           # signalled mid-start, not once serving
    stop_and_collect(proc, log, seen)


def _name(p) -> str:
    try:
        return p.name()
    except psutil.Error:
        return ""

"""The page `lensapp serve` answers while it starts (`shell.py`): before the heavy imports, on the port the
real app then serves."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

from conftest import REPO

from lensapp import shell

HEAVY = ("torch", "gradio", "vllm", "nnsight", "transformers", "altair", "fastapi", "uvicorn")


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_the_serve_path_imports_nothing_heavy_before_the_page():
    code = ("import sys, lensapp.cli, lensapp.server, lensapp.shell, lensapp.service.fields;"
            f"print([m for m in {HEAVY!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_the_shell_answers_then_hands_its_listening_socket_over():
    sock = shell.listen("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/"
    starting = shell.Shell(sock).start()
    status, page = get(url + "?tab=logit&prompt=Hi")
    assert status == 200 and "the model is loading" in page and 'http-equiv="refresh"' in page
    status, body = get(url + "health")
    assert status == 200 and json.loads(body)["state"] == "starting"
    assert get(url + "gradio_api/info")[0] == 503
    handed = starting.handover()
    assert handed is sock and sock.fileno() != -1
    with socket.create_connection(sock.getsockname()[:2], timeout=5):      # waits in the backlog, not refused
        pass
    sock.close()


def test_a_silent_connection_is_closed_after_the_idle_time_and_pages_are_still_answered():
    sock = shell.listen("127.0.0.1", 0)
    address = sock.getsockname()[:2]
    starting = shell.Shell(sock, idle_seconds=0.5).start()
    try:
        for sent in (b"", b"GET / HTTP/1.1\r\nHost: x\r\n"):        # nothing, and a request never finished
            with socket.create_connection(address, timeout=10) as idle:
                idle.sendall(sent)
                t = time.perf_counter()
                assert idle.recv(1024) == b""                           # the shell closed it ...
                assert time.perf_counter() - t < 5                      # ... at its idle time, not never
        status, page = get(f"http://{address[0]}:{address[1]}/")
        assert status == 200 and "the model is loading" in page
    finally:
        starting.handover().close()


def test_a_port_in_use_is_one_line():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        try:
            shell.listen("127.0.0.1", port)
        except shell.ListenError as e:
            assert str(e) == f"port {port} on 127.0.0.1 is in use (another app?); choose another with --port"
        else:
            raise AssertionError("a port in use was listened on")


def test_serve_shows_the_page_before_it_fails_on_a_model_that_is_not_there(tmp_path):
    """The page answers while the heavy imports run; a model that cannot load still ends in one line, exit 2."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "lensapp", "serve", "--port", str(port),
                             "--model", str(tmp_path / "no-such-model")], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        page = None
        deadline = time.monotonic() + 60
        while page is None and proc.poll() is None and time.monotonic() < deadline:
            try:
                page = get(f"http://127.0.0.1:{port}/")
            except OSError:
                time.sleep(0.05)
        assert page is not None and page[0] == 200 and "the model is loading" in page[1]
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2
    assert [line for line in err.splitlines() if line.startswith("error:")] == [err.strip().splitlines()[-1]]
    assert "no-such-model" in err

"""The running app as a service: /health, identical requests computed once, and a crash it heals from.

These use the app the browser tests use (`app_url`: `python app.py` on vLLM). The crash test kills
vLLM's EngineCore under load, so it is marked `disruptive` and runs after everything else.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request

import psutil
import pytest
from conftest import APP_PID, descendant


def health(url: str) -> dict:
    """/health's JSON, whatever its status (503 while the engine restarts or is down)."""
    import urllib.error

    try:
        with urllib.request.urlopen(url + "health", timeout=10) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        return json.loads(e.read())


def ready(url: str, timeout: float = 600) -> dict:
    """/health once the engine serves (the app's page is up seconds before its model is)."""
    deadline = time.monotonic() + timeout
    while (h := health(url))["state"] != "ready" and time.monotonic() < deadline:
        time.sleep(0.5)
    return h


def clients(url: str, n: int):
    from gradio_client import Client

    return [Client(url, verbose=False) for _ in range(n)]


def test_health_is_plain_json(app_url):
    h = ready(app_url)
    assert h["state"] == "ready" and h["model"] == "SmolLM2-135M-Instruct" and h["backend"] == "vllm-cpu"
    for key in ("device", "dtype", "uptime_s", "restarts", "queue_depth", "calls", "cache", "forwards", "memory"):
        assert key in h, key
    assert set(h["calls"]) == {"served", "failed", "restarted", "timed_out", "cancelled", "refused_busy"}
    plan = h["memory"]["plan"]
    parts = [v for k, v in plan.items() if k.endswith("_mb") and k not in ("total_mb", "limit_mb")]
    assert plan["total_mb"] - len(parts) <= sum(parts) <= plan["total_mb"]         # each part rounded down
    assert 0 < h["memory"]["now"]["processes_rss_mb"]


def test_one_link_opened_by_sixteen_costs_at_most_two_forwards(app_url):
    users = clients(app_url, 16)
    args = ("The Eiffel Tower is located in the city of", "both", "20,24,28", 4, "Paris, Rome")
    before = health(app_url)
    results = [None] * len(users)

    def open_link(i):
        results[i] = users[i].predict(*args, api_name="/lens")

    threads = [threading.Thread(target=open_link, args=(i,)) for i in range(len(users))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    after = health(app_url)
    assert all(r is not None and r == results[0] for r in results)           # everyone got the same answer ...
    forwards = after["forwards"].get("lens", 0) - before["forwards"].get("lens", 0)
    assert 1 <= forwards <= 2, forwards                                          # ... computed at most twice


def test_a_shared_link_starts_its_readout_when_its_page_is_asked_for(app_url):
    """GET /?<link> (what a browser, or a chat app unfurling the link, asks first) starts the readout;
    the page's own request, built the same way, then finds it: one engine forward for both."""
    from urllib.parse import quote

    prompt = f"Prefetched {time.time()}: the river runs through the old town"
    before = ready(app_url)
    with urllib.request.urlopen(f"{app_url}?v=1&tab=logit&prompt={quote(prompt)}&layers=all&k=5", timeout=30) as r:
        assert r.status == 200
    for _ in range(300):
        now = health(app_url)
        if now["cache"]["misses"] > before["cache"]["misses"] and now["in_flight"] == 0:
            break
        time.sleep(0.1)
    (user,) = clients(app_url, 1)
    out = user.predict(prompt, "logit", "all", 5, "", api_name="/lens")
    after = health(app_url)
    assert out["layers"] == list(range(30))
    assert after["forwards"].get("lens", 0) - before["forwards"].get("lens", 0) == 1
    assert after["cache"]["hits"] + after["cache"]["shared_in_flight"] > \
        before["cache"]["hits"] + before["cache"]["shared_in_flight"]


def test_api_errors_are_one_plain_line(app_url):
    (c,) = clients(app_url, 1)
    with pytest.raises(Exception) as e:
        c.predict("x", 8, "logit", "all", "'five'", 0.0, api_name="/generate")
    message = str(e.value)
    assert "k must be a whole number" in message and "&#" not in message and "\n" not in message.strip()


@pytest.mark.disruptive
def test_killing_the_engine_under_load_heals_in_the_same_process(app_url):
    """SIGKILL vLLM's EngineCore while requests run: each ends with an answer or the one-line 'restarted'
    message (none hangs), the same web process answers normally again within 2 minutes, and /health
    counts the restart."""
    app = psutil.Process(APP_PID[0])
    core = descendant(app.pid, "EngineCore")
    users = clients(app_url, 4)
    outcomes = [None] * len(users)
    restarts = health(app_url)["restarts"]

    def run(i):
        try:
            users[i].predict(f"Once upon a time, in a land far away, dragon number {i}", 64, "both", "all", 5, 0.0,
                             api_name="/generate")
            outcomes[i] = "answered"
        except Exception as e:  # noqa: BLE001 - the message is what is checked
            outcomes[i] = str(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(users))]
    for t in threads:
        t.start()
    time.sleep(3)
    os.kill(core.pid, signal.SIGKILL)
    killed = time.time()
    for t in threads:
        t.join(180)
    assert all(o is not None for o in outcomes), f"requests hung: {outcomes}"
    assert all(o == "answered" or "restarted" in o for o in outcomes), outcomes
    assert any(o != "answered" for o in outcomes)                     # the kill did hit requests in flight
    (c,) = clients(app_url, 1)
    assert health(app_url)["state"] in ("restarting", "ready")
    forwards = health(app_url)["forwards"].get("lens", 0)
    result = c.predict("The capital of France is", "logit", "3,17,29", 3, "", api_name="/lens")   # asked nowhere else
    assert result["model_next_token"] == " Paris" and result["layers"] == [3, 17, 29]
    assert time.time() - killed < 120
    h = health(app_url)
    assert h["state"] == "ready" and h["restarts"] == restarts + 1
    assert h["forwards"]["lens"] == forwards + 1                      # the new engine computed it
    assert app.is_running() and not core.is_running()


def test_a_login_guards_the_app_when_asked_for():
    """LENSAPP_AUTH: Gradio's own login in front of the page and the API (no engine needed: a stand-in)."""
    from types import SimpleNamespace

    from fastapi.testclient import TestClient

    from lensapp.config import Config
    from lensapp.engine import ModelInfo
    from lensapp.server import make_app

    service = SimpleNamespace(info=ModelInfo("stand-in", 4, 8, 100, "none", "cpu", "float32"), jlens=None,
                              jlens_layers=[], jlens_error=None, chat_layers=lambda lens: [0, 1, 2, 3],
                              model=SimpleNamespace(path="stand-in", family=None),
                              health=lambda: {"state": "ready", "queue_depth": 0},
                              status=lambda: {"state": "ready", "reason": "", "queue_depth": 0})
    with TestClient(make_app(service, Config.of(auth="alice:secret"))) as client:
        assert client.get("/config").status_code == 401                  # the app's config needs the login
        assert client.post("/login", data={"username": "alice", "password": "wrong"}).status_code >= 400
        assert client.post("/login", data={"username": "alice", "password": "secret"}).status_code == 200
        assert client.get("/config").status_code == 200
        assert client.get("/health").json()["state"] == "ready"           # health stays open to the platform
    with TestClient(make_app(service, Config())) as client:
        assert client.get("/config").status_code == 200                   # open by default

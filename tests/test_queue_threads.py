"""A visitor's queue join is answered while every handler waits for the engine.

Gradio's handlers and FastAPI's join dependency shared anyio's default 40 threads: with 40 handlers
blocked on the engine, a join waited for one to finish, and gradio_client gives up after 5 s (the
workshop's lost link opens). `server.queue_handlers` gives the handlers their own threads. A tiny
Gradio app with the same queue settings, whose handler blocks until the test lets it go.
"""

from __future__ import annotations

import threading
import time

import gradio as gr
import httpx
import pytest
from conftest import _free_port

from lensapp import server

HANDLERS = 64          # the app's default: max_batch 16 + queue_size 48
BLOCKED = 44           # more handlers waiting than anyio's default limiter has threads


@pytest.fixture
def blocking_app():
    """Mounted and served as `server.make_app` and `server.serve` do: FastAPI, mount_gradio_app, uvicorn."""
    import uvicorn
    from fastapi import FastAPI

    release, entered = threading.Event(), []

    def wait(text: str) -> str:
        entered.append(text)
        release.wait(60)
        return text

    with gr.Blocks() as demo:
        box = gr.Textbox()
        box.submit(wait, box, box, api_name="wait")
    server.queue_handlers(demo, HANDLERS, 16)
    port = _free_port()
    app = gr.mount_gradio_app(FastAPI(), demo, path="/")
    http = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=http.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not http.started and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}/gradio_api", entered, release
    finally:
        release.set()
        http.should_exit = True
        thread.join(10)


def join(base: str, n: int, timeout: float = 5.0) -> httpx.Response:
    body = {"data": [f"visitor {n}"], "fn_index": 0, "session_hash": f"s{n}", "event_data": None,
            "trigger_id": None}
    return httpx.post(f"{base}/queue/join", json=body, timeout=timeout)


def test_a_join_is_answered_while_more_handlers_than_default_threads_wait(blocking_app):
    base, entered, release = blocking_app
    for n in range(BLOCKED):
        assert join(base, n).status_code == 200
    deadline = time.monotonic() + 30
    while len(entered) < BLOCKED and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(entered) == BLOCKED, f"only {len(entered)} of {BLOCKED} handlers ran at once"
    t = time.perf_counter()
    late = join(base, BLOCKED, timeout=10)
    assert late.status_code == 200 and time.perf_counter() - t < 2.0
    release.set()

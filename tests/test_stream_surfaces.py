"""Streaming as a user meets it, on the real app over the tiny model (tests/tiny_app.py): the API's `submit()`
sees each step as it is written and `predict()` the same answer as before; a client that leaves frees the engine;
`lensapp generate --stream` prints a line per step, then the result."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from tiny_app import served

from lensapp import config
from lensapp.server import make_app
from lensapp.service.requests import ChatRequest, GenerateRequest

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def tiny_url(tiny_service):
    with served(make_app(tiny_service, config.Config.of(cache_entries=0))) as url:
        yield url


@pytest.fixture(scope="module")
def client(tiny_url):
    from gradio_client import Client

    return Client(tiny_url, verbose=False)


def health(url: str) -> dict:
    return httpx.get(f"{url}health", timeout=10).json()


def frames_and_answer(job) -> tuple[list[dict], dict]:
    outputs = list(job)                             # every yield, as gradio_client's submit() hands them over
    assert outputs and outputs[-1] == job.result()
    return outputs[:-1], outputs[-1]


def as_sent(answer: dict) -> dict:
    return json.loads(json.dumps(answer, default=str))


def test_the_api_client_sees_each_step_of_a_generation_then_the_answer(client, tiny_service):
    args = (PROMPT, 10, "both", "all", 3)
    frames, answer = frames_and_answer(client.submit(*args, api_name="/generate"))
    whole = tiny_service.generate(GenerateRequest.parse(prompt=PROMPT, max_tokens=10, lens="both", layers="all", k=3))
    assert answer == as_sent(whole.to_json()) == client.predict(*args, api_name="/generate")
    assert [f["frame"] for f in frames] == ["step"] * len(whole.steps)
    assert [f["step"] for f in frames] == list(range(len(whole.steps)))
    assert [f["token_id"] for f in frames] == whole.token_ids
    assert [f["lenses"] for f in frames] == [s["lenses"] for s in answer["steps"]]
    texts = [f["text"] for f in frames]
    assert texts[-1] == whole.text and all(b.startswith(a) for a, b in zip(texts, texts[1:]))


def test_the_api_client_sees_each_token_of_a_chat_reply_then_the_answer(client, tiny_service):
    messages = [{"role": "user", "content": "Hi"}]
    frames, answer = frames_and_answer(client.submit(messages, "logit", -1, 6, api_name="/chat"))
    whole = tiny_service.chat(ChatRequest.parse(messages=messages, lens="logit", layer=-1, max_tokens=6))
    assert answer == as_sent(whole.to_json())
    assert [f["token_id"] for f in frames] == whole.token_ids
    assert [f["readout"] for f in frames] == answer["readout"]


def test_a_client_that_cancels_frees_the_engine_at_once(client, tiny_url, monkeypatch):
    from lensapp.engine.run import hf_backend

    def slow(*args, **kwargs):          # a model this small writes 64 tokens before a client could cancel
        time.sleep(0.1)
        return body(*args, **kwargs)

    body = hf_backend.lens_body
    monkeypatch.setattr(hf_backend, "lens_body", slow)
    before = health(tiny_url)["calls"]
    job = client.submit("Once upon a time", 64, "logit", "all", 3, api_name="/generate")
    deadline = time.monotonic() + 60
    while not job.outputs() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert job.outputs() and job.outputs()[0]["frame"] == "step"
    t = time.monotonic()
    job.cancel()
    while time.monotonic() < deadline:
        now = health(tiny_url)
        if now["calls"]["cancelled"] > before["cancelled"]:
            break
        time.sleep(0.05)
    waited = time.monotonic() - t
    # the count moves on the engine's loop; the reader's thread then gives its slot back (`admitted`)
    while (now["in_flight"] or now["admitted"]) and time.monotonic() < deadline:
        time.sleep(0.05)
        now = health(tiny_url)
    assert now["in_flight"] == 0 and now["admitted"] == 0, now
    assert now["calls"]["cancelled"] == before["cancelled"] + 1 and now["calls"]["served"] == before["served"]
    assert waited < 2.0, f"the engine let go {waited:.1f} s after the cancel"


def test_the_command_line_streams_a_json_line_per_step_then_the_result(tiny_model_dir):
    import subprocess
    import sys
    from pathlib import Path

    out = subprocess.run([sys.executable, "-m", "lensapp", "generate", PROMPT, "--model", str(tiny_model_dir),
                          "--backend", "transformers", "--max-tokens", "6", "--k", "3", "--stream"],
                         cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    frames, result = lines[:-1], lines[-1]
    assert [f["frame"] for f in frames] == ["step"] * len(result["steps"]) and "frame" not in result
    assert [f["step"] for f in frames] == list(range(len(result["steps"])))
    assert [f["token_id"] for f in frames] == result["token_ids"]
    assert [f["lenses"] for f in frames] == [s["lenses"] for s in result["steps"]]
    assert frames[-1]["text"] == result["text"]

"""The page's side of a streamed trace (engine/run/served_stream.py, `Wire.astream`) without an engine: how each
stream a service writes is read.

A stand-in HTTP server on loopback answers STREAM_PATH as `lensapp engine`'s stream route does (frames of plain data:
steps, then the answer) or as a broken or hostile one would: cut before its first frame (nothing reached the page: it
may be asked again), cut after it (StreamBroken: not asked again), a frame that names code (refused in one line, no
code run), a service without the route. The real route: tests/test_engine_service_stream.py."""

import asyncio
import io
import os
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from lensapp.engine.run.protocol import StartFailed, Unreachable
from lensapp.engine.run.replies import RESULT, plain_answer, plain_bytes
from lensapp.engine.run.served import ServeTrace, Wire
from lensapp.engine.run.served_stream import (
    MEDIA_TYPE,
    STREAM_KEY_HEADER,
    STREAM_PATH,
    StreamBroken,
    framed,
    stream_into,
)

KEY = secrets.token_urlsafe(32)


class Output:
    """What a finished vLLM RequestOutput carries here."""

    def __init__(self, token_ids):
        self.outputs = [type("Completion", (), {"token_ids": token_ids, "finish_reason": "stop"})()]
        self.finished = True


def step_frame(tokens, steps) -> bytes:
    return framed(plain_bytes({"tokens": tokens, "steps": steps}))


ANSWER = framed(plain_bytes(plain_answer({"saved": {"x": 1}, RESULT: Output([5, 6])}, None)))
STEPS = step_frame([5], [(0, {"logit": torch.ones(2)})]) + step_frame([5, 6], [(1, {"logit": torch.zeros(2)})])


class Hostile:
    def __reduce__(self):
        return (os.system, ("touch /tmp/lensapp-stream-pwned",))


def hostile_frame() -> bytes:
    buffer = io.BytesIO()
    torch.save({"tokens": [1], "steps": [(0, Hostile())]}, buffer)
    return framed(buffer.getvalue())


# What the stand-in writes on STREAM_PATH, by scenario (None: the route is missing).
BODIES = {"whole": STEPS + ANSWER, "cut before": b"", "cut after": STEPS[:len(STEPS) // 2 + 40],
          "hostile": hostile_frame() + ANSWER, "no route": None}


@pytest.fixture(scope="module")
def stand_in():
    scenario, seen = {"name": "whole"}, {}

    class Handler(BaseHTTPRequestHandler):         # HTTP/1.0: the body ends when the connection closes
        def do_POST(self):  # noqa: N802 - http.server's name
            seen["blob"] = self.rfile.read(int(self.headers.get("content-length", 0)))
            seen["key"] = self.headers.get(STREAM_KEY_HEADER)
            if self.headers.get("ndif-api-key") != KEY:
                return self._send(401, "application/json", b'{"detail": "Invalid API key"}')
            body = BODIES[scenario["name"]] if self.path == STREAM_PATH else None
            if body is None:
                return self._send(404, "application/json", b'{"detail": "Not Found"}')
            self._send(200, MEDIA_TYPE, body)

        def _send(self, status, kind, body):
            self.send_response(status)
            self.send_header("content-type", kind)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", scenario, seen
    server.shutdown()


class Sink:
    def __init__(self):
        self.readouts = []

    def readout(self, index, value):
        self.readouts.append((index, value))


def run(url: str, key: str = KEY, stream_key: str = "ab12"):
    """(the outputs ServeTrace yields for a streamed trace, the sink's readouts, the error raised or None)."""
    wire, sink, outputs = Wire(url, key), Sink(), []

    async def stream():
        async with wire.async_client() as client:
            trace = ServeTrace(wire, client)
            trace.blob = b"a trace"
            stream_into(trace, stream_key, sink)
            async for out in trace:
                outputs.append(out)
    try:
        asyncio.run(stream())
    except Exception as e:  # noqa: BLE001 - returned for the test to look at
        return outputs, sink.readouts, e
    return outputs, sink.readouts, None


def test_a_stream_yields_each_step_then_the_finished_output(stand_in):
    url, scenario, seen = stand_in
    scenario["name"] = "whole"
    outputs, readouts, error = run(url)
    assert error is None and seen["blob"] == b"a trace" and seen["key"] == "ab12"
    assert [o.outputs[0].token_ids for o in outputs] == [[5], [5, 6], [5, 6]]
    assert [o.finished for o in outputs] == [False, False, True] and outputs[-1].saves == {"saved": {"x": 1}}
    assert [i for i, _ in readouts] == [0, 1] and torch.equal(readouts[1][1]["logit"], torch.zeros(2))


def test_a_broken_stream_says_whether_anything_reached_the_page(stand_in):
    """Before its first frame a stream may be asked again (Unreachable); after it, not (StreamBroken)."""
    url, scenario, _ = stand_in
    scenario["name"] = "cut before"
    _, _, error = run(url)
    assert isinstance(error, Unreachable) and not isinstance(error, StreamBroken), error
    scenario["name"] = "cut after"
    outputs, readouts, error = run(url)
    assert isinstance(error, StreamBroken) and len(outputs) == 1 and len(readouts) == 1, error
    _, _, error = run("http://127.0.0.1:9")                  # nothing listens: nothing reached the page
    assert isinstance(error, Unreachable) and not isinstance(error, StreamBroken), error


def test_a_hostile_or_foreign_stream_is_refused_in_one_line(stand_in):
    url, scenario, _ = stand_in
    scenario["name"] = "hostile"
    _, readouts, error = run(url)
    assert isinstance(error, StartFailed) and "streamed what a page does not read" in str(error), error
    assert not readouts and not os.path.exists("/tmp/lensapp-stream-pwned")
    scenario["name"] = "no route"
    _, _, error = run(url)
    assert isinstance(error, StartFailed) and "404" in str(error), error
    scenario["name"] = "whole"
    _, _, error = run(url, key="wrong")
    assert isinstance(error, StartFailed) and "refused this key" in str(error), error

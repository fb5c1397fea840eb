"""The page's side of the wire (engine/run/served.py) without an engine: how each answer of a service is read.

A stand-in HTTP server on loopback answers as nnsight-serve behind `lensapp engine`'s layer does (401 without the
key, 503 before its engine is up, a torch.save'd {"saves", "error"} made plain otherwise); a closed port is a
service that is gone. What a hostile answer cannot do: tests/test_engine_trust.py."""

import io
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from conftest import _free_port

from lensapp.engine.run.protocol import ModelInfo, StartFailed, Unreachable
from lensapp.engine.run.replies import plain_reply
from lensapp.engine.run.served import PROGRESS_PATH, RESULT, ServeTrace, Wire, finished
from lensapp.engine.run.service_checks import mismatch, stack_fingerprint

KEY = secrets.token_urlsafe(32)


class Completion:
    def __init__(self, token_ids):
        self.token_ids, self.finish_reason = token_ids, "length"


class Output:
    """What a finished vLLM RequestOutput carries here."""

    def __init__(self, token_ids):
        self.outputs, self.finished = [Completion(token_ids)], True


@pytest.fixture(scope="module")
def stand_in():
    answers = {"status": 200}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers.get("content-length", 0)))
            if self.headers.get("ndif-api-key") != KEY:
                return self._send(401, b'{"detail": "Invalid API key"}')
            if answers["status"] != 200:
                return self._send(answers["status"], b'{"detail": "Engine not ready"}')
            buffer = io.BytesIO()
            torch.save({"saves": {"saved": {"x": 1}, RESULT: Output([5, 6])}, "error": None}, buffer)
            self._send(200, plain_reply(buffer.getvalue()))

        def do_GET(self):  # noqa: N802
            if self.path == PROGRESS_PATH:
                if self.headers.get("ndif-api-key") != KEY:
                    return self._send(401, b'{"detail": "Invalid API key"}')
                return self._send(answers["status"], b'{"cpu_seconds": 12.5}')
            self._send(answers["status"], b'{"status": "ok"}')

        def _send(self, status, body):
            self.send_response(status)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/", answers
    server.shutdown()


def test_an_answer_is_the_finished_output_with_the_saves_on_it(stand_in):
    url, _ = stand_in
    out = finished(*Wire(url, KEY).post(b"a trace"))
    assert out.outputs[0].token_ids == [5, 6] and out.saves == {"saved": {"x": 1}}
    Wire(url).health()                                      # /health needs no key


def test_a_trace_is_awaited_or_iterated_as_the_async_engine_stream_and_sent_once(stand_in):
    """What VLLMBackend._saved reads (`async for` over the backend, counting each output as a step): here one
    output, the finished one; and the service's CPU time for the stall watch, behind the key."""
    import asyncio

    url, _ = stand_in
    wire = Wire(url, KEY)

    async def stream():
        async with wire.async_client() as client:
            trace = ServeTrace(wire, client)
            trace.blob = b"a trace"
            outputs = [out async for out in trace]
            return outputs, await trace                # sent once: awaiting again gives the same output
    outputs, again = asyncio.run(stream())
    assert len(outputs) == 1 and outputs[0] is again and outputs[0].outputs[0].token_ids == [5, 6]
    assert wire.progress() == 12.5
    with pytest.raises(StartFailed, match="refused this key"):
        Wire(url, "wrong").progress()


def test_a_wrong_key_is_refused_for_good(stand_in):
    url, _ = stand_in
    with pytest.raises(StartFailed, match="refused this key") as refused:
        Wire(url, "wrong").post(b"a trace")
    assert refused.value.permanent and not isinstance(refused.value, Unreachable)


def test_a_service_starting_or_gone_is_unreachable(stand_in):
    url, answers = stand_in
    answers["status"] = 503
    try:
        with pytest.raises(Unreachable, match="is starting"):
            Wire(url).health()
        with pytest.raises(Unreachable, match="is starting"):
            Wire(url, KEY).post(b"a trace")
    finally:
        answers["status"] = 200
    gone = f"http://127.0.0.1:{_free_port()}"
    with pytest.raises(Unreachable, match="does not answer"):
        Wire(gone).health()
    with pytest.raises(Unreachable, match="does not answer"):
        Wire(gone, KEY).post(b"a trace")


def test_a_trace_error_is_raised_and_a_dead_engine_is_waited_for():
    with pytest.raises(RuntimeError, match="ValueError: bad layer"):
        finished({}, {"type_name": "ValueError", "message": "bad layer", "traceback": ""})
    with pytest.raises(Unreachable, match="vLLM engine died"):
        finished({}, {"type_name": "EngineDeadError", "message": "EngineCore died", "traceback": ""})
    with pytest.raises(RuntimeError, match="without the request's output"):
        finished({"saved": 1}, None)


def test_a_page_of_another_model_is_refused_naming_both():
    info = ModelInfo(name="m", n_layers=30, d_model=576, vocab_size=49152, backend="vllm-serve", device="remote",
                     dtype="float32")
    same = {"n_layers": 30, "d_model": 576, "vocab_size": 49152, "dtype": "float32", "jlens": ""}
    assert mismatch(same, info) is None
    assert mismatch(same | {"n_layers": 36, "d_model": 4096}, info) == \
        "the engine service serves another model: n_layers 36 (the page: 30), d_model 4096 (the page: 576)"
    assert "start the page with --dtype bfloat16" in mismatch(same | {"dtype": "bfloat16"}, info)


def test_a_stack_fingerprint_sees_its_layers_and_values():
    J = torch.eye(4, dtype=torch.bfloat16).expand(2, 4, 4).clone()
    base = stack_fingerprint((1, 3), J)
    assert base == stack_fingerprint([1, 3], J.float())           # the values as the engine holds them (bf16)
    moved = J.clone()
    moved[0, 0, 1] = 0.5
    assert len({base, stack_fingerprint((1, 2), J), stack_fingerprint((1, 3), moved)}) == 3

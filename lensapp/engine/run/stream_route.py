"""The engine service's stream route (`served_stream.STREAM_PATH`): a trace run, its steps written as they come.

nnsight-serve's generate route runs a serialized trace and answers once, at the request's end. A page's streamed
generation (`served_stream.py`) is sent here instead: the trace is built as that route builds it (nnsight-serve's own
`_build_tracer`, then `prepare` and `_attach_mediators`, with no await between, as its module asks) and submitted to
the service's vLLM engine as that route submits it; what differs is what comes back while it runs. The trace
publishes each step's readout in the worker under the key the page wrote into it (`outbox.py`); this service's
own courier (`courier.py`, the in-process one) takes them between engine steps, and every engine output and taken
step is written to the page at once, as a step frame; the last frame is the answer as the one-shot route gives it,
made plain here (`replies.plain_answer`). Frames: `served_stream.py`.

The page gone (its stream closed: Stop, a page closed, the page's request cancelled) is seen at once (the ASGI
`http.disconnect`, watched while the frames are written) and cancels the request's task: vLLM's `generate` aborts
the request on its cancellation, and the worker's part of it is collected, as nnsight-serve's route frees it. The
route sits inside nnsight-serve's app, behind the service's key (`engine_service.guarded`) like every other route.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import uuid
from contextlib import aclosing

from .errors import one_line
from .replies import RESULT, plain, plain_answer, plain_bytes
from .served_stream import MEDIA_TYPE, STREAM_KEY_HEADER, STREAM_PATH, framed

log = logging.getLogger(__name__)

KEY_FORM = re.compile(r"[0-9a-f]{1,64}")        # a stream key as a page makes it (uuid4().hex)
_cleanups: set = set()                          # workers being freed (asyncio holds tasks weakly)


def add_stream_route(app, backend) -> None:
    """POST STREAM_PATH on nnsight-serve's `app`, running traces on `backend`'s engine (a VLLMBackend)."""
    if not any(getattr(route, "path", None) == STREAM_PATH for route in app.routes):
        app.add_route(STREAM_PATH, StreamRoute(backend), methods=["POST"])     # an ASGI app: it writes as it goes


class StreamRoute:
    """ASGI: the request's trace, its frames written until the last, or until the page is gone."""

    def __init__(self, backend):
        self.backend = backend

    async def __call__(self, scope, receive, send):
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
        key = headers.get(STREAM_KEY_HEADER, "")
        if key and not KEY_FORM.fullmatch(key):
            return await refuse(send, 400, f"{STREAM_KEY_HEADER}: a streamed trace's key is hex, at most 64 long")
        model = self.backend.model
        if model.vllm_entrypoint is None:
            return await refuse(send, 503, "Engine not ready")
        body = await read_body(receive)
        if body is None:
            return
        compress = headers.get("nnsight-compress", "false").lower() == "true"
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", MEDIA_TYPE.encode())]})
        writer = asyncio.ensure_future(write(streamed(model, self.backend.courier, body, compress, key), send))
        gone = asyncio.ensure_future(until_gone(receive))
        try:
            done, _ = await asyncio.wait({writer, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (writer, gone):
                task.cancel()
            await asyncio.gather(writer, gone, return_exceptions=True)
        if writer not in done:
            log.info("a page left its stream %s: its request aborted", key[:8] or "(no steps)")
        elif writer.exception() is not None:
            log.error("a stream failed: %s", one_line(writer.exception()))


async def write(frames, send) -> None:
    async with aclosing(frames):
        async for data in frames:
            await send({"type": "http.response.body", "body": data, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


async def streamed(model, courier, body: bytes, compress: bool, key: str):
    """The trace's frames: a step frame whenever the engine stepped or the courier brought steps, then the answer.
    Closed early, its request is cancelled (aborted on vLLM) and waited for."""
    from nnsight.intervention.errors import capture_exception

    try:
        request = build(model, body, compress)
    except Exception as e:  # noqa: BLE001 - a corrupt or incompatible trace: its error, as the generate route answers
        log.exception("Failed to build a streamed trace")
        yield framed(plain_bytes(plain_answer({}, capture_exception(e))))
        return
    events: asyncio.Queue = asyncio.Queue()
    key = courier.open(Inbox(events), key) if key and courier is not None else ""
    run = asyncio.ensure_future(run_request(model.vllm_entrypoint, request, events, courier if key else None))
    try:
        while True:
            batch = [await events.get()]
            while not events.empty():
                batch.append(events.get_nowait())
            tokens, steps, end = None, [], None
            for kind, *value in batch:
                if kind == "tokens":
                    tokens = value[0]
                elif kind == "step":
                    steps.append(tuple(value))
                else:
                    end = value
            if tokens is not None or steps:
                yield framed(plain_bytes({"tokens": tokens, "steps": plain(steps)}))
            if end is not None:
                yield framed(await asyncio.to_thread(answer_bytes, *end))
                return
    finally:
        if key:
            courier.close(key)
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)


def answer_bytes(saves: dict, error) -> bytes:
    """The answer as the one-shot route's is made plain (`engine_service.PlainReplies`): in a thread, as there."""
    return plain_bytes(plain_answer(saves, error))


def build(model, body: bytes, compress: bool) -> tuple:
    """(prompt, sampling params, LoRA request) of a serialized trace, its workers attached: nnsight-serve's generate
    route's build, synchronous from end to end (no two builds may interleave on the model's one interleaver)."""
    from nnsight.modeling.vllm.serve import server

    try:
        # nnsight-serve's private rebuild: the one its generate route runs (the AST node it adds is needed here too)
        tracer = server._build_tracer(body, compress)
        _, (prompts, params, loras), forward_kwargs = tracer.prepare(tracer.info.code)
        if len(prompts) != 1:
            raise ValueError(f"a streamed trace has one prompt (this one has {len(prompts)})")
        model._attach_mediators(params, **forward_kwargs)
    finally:
        model.interleaver.cancel()       # as the generate route: the workers travel on the request now
    return prompts[0], params[0], loras[0] if loras else None


async def run_request(engine, request: tuple, events: asyncio.Queue, courier) -> None:
    """The request on vLLM, as nnsight-serve's generate route runs one: each output's tokens into `events` (and the
    courier asked for the steps), then ("end", saves, error). Cancelled, vLLM aborts it and its worker is freed."""
    from nnsight.intervention.errors import capture_exception
    from nnsight.modeling.vllm.engines.engine import acollect

    prompt, params, lora = request
    request_id, collected = uuid.uuid4().hex, False
    try:
        output = None
        async for output in engine.generate(prompt, params, request_id, lora_request=lora):
            events.put_nowait(("tokens", [int(t) for t in output.outputs[0].token_ids]))
            if courier is not None:
                courier.kick()
        entry = await acollect(engine, request_id, output)
        collected = True
        saves, error = (dict(entry["saves"]), entry["error"]) if entry is not None else ({}, None)
        # The block saves the finished output at its end (served.serialize); a generation that ended before its
        # max_tokens (its end of text) never gets there: its output is the one vLLM gave, as in-process.
        saves.setdefault(RESULT, output)
        events.put_nowait(("end", saves, error))
    except Exception as e:  # noqa: BLE001 - the request's failure is its answer's error, as on the generate route
        log.exception("a streamed generation failed")
        events.put_nowait(("end", {}, capture_exception(e)))
    finally:
        if not collected:           # cancelled or failed: free its worker, as nnsight-serve's route does (kept alive
            cleanup = asyncio.ensure_future(acollect(engine, request_id))      # while a second cancel goes past it)
            _cleanups.add(cleanup)
            cleanup.add_done_callback(_cleanups.discard)
            await asyncio.shield(cleanup)


class Inbox:
    """The courier's sink for one stream: each step as it is taken, into the stream's events."""

    def __init__(self, events: asyncio.Queue):
        self.events = events

    def readout(self, index: int, value) -> None:
        self.events.put_nowait(("step", int(index), value))


async def read_body(receive) -> bytes | None:
    """The request's body (None: the page left while sending it)."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def until_gone(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def refuse(send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})

"""A streamed trace on an engine service: the page's half, and the frames both halves write and read.

In-process, a streamed generation's trace publishes each step's readout in vLLM's worker under a key the page
made (`outbox.py`), and the page's courier takes them between engine steps (`courier.py`). Through an engine
service the trace is the same (the key travels in it, and in STREAM_KEY_HEADER); the service takes the steps with
its own courier and writes them to the page as they come, on its stream route (`stream_route.py`, STREAM_PATH).
Every generation and chat goes there, streamed or not (`RemoteBackend._saved`: without a key, its frames carry its
tokens only), since there the answer carries vLLM's own finished output, as in-process. The frames:

- a step frame, {"tokens": the tokens written so far (or None), "steps": [(index, readout), ...]}, as often as
  the engine steps and the worker's steps arrive;
- the last frame, the trace's answer as the one-shot route gives it ({"saves", "error"}: `replies.plain_answer`).

Each frame is plain data (`replies.plain_bytes`, read with `replies.read_plain`: a page unpickles no code), after
its length (8 bytes, big-endian). On the page, `StreamKeys` is the backend's courier (it only makes keys: the steps
come in the frames), `stream_into` marks a trace as streamed into a sink, and `outputs` is what `ServeTrace`
yields for it: each step frame's tokens as an unfinished output (its steps handed to the sink first), then the
finished one, read as the one-shot answer is (`served.finished`), so the streamed whole is the one-shot whole.

Closing the stream (a page closed, Stop: the request's task cancelled, `step_stream.py`) closes the HTTP response;
the service sees the client gone and aborts the request on vLLM. A stream that breaks before its first frame is
`Unreachable` (nothing reached the page: it may be asked again, on this engine or another); one that breaks
after is `StreamBroken` (an Unreachable too: the engine waits for the service as for any lost answer).
"""

from __future__ import annotations

import contextlib
import struct
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator

from .protocol import Unreachable
from .replies import Completion, Finished, NotPlain, read_answer, read_plain

STREAM_PATH = "/lensapp/stream"                # the service's route (stream_route.py), behind its key like the rest
STREAM_KEY_HEADER = "lensapp-stream-key"       # the key the trace publishes its steps under
MEDIA_TYPE = "application/x-lensapp-frames"    # not octet-stream: the service's PlainReplies lets it pass as it goes
LENGTH = struct.Struct(">Q")
MAX_FRAME = 1 << 32                            # a frame longer than this is not one this service wrote


class StreamBroken(Unreachable):
    """A stream that broke after its first frame: the steps handed on cannot be taken back, so it is not asked
    again elsewhere, only reported (the engine then waits for the service, as for any lost answer)."""


class StreamKeys:
    """The courier of a backend on an engine service (`VLLMBackend.courier`'s place): a key for each streamed
    trace; the service takes the steps from its worker itself, and they reach the page in the stream's frames."""

    working = True

    def open(self, sink) -> str:
        return uuid.uuid4().hex

    def close(self, key: str) -> None:
        """Nothing held here: the service forgets a stream's steps when it ends."""

    def kick(self) -> None:
        """Nothing to take here: the service takes the steps as its engine steps."""


@dataclass(frozen=True)
class Target:
    """Where a streamed trace's steps go: its key (in the trace) and the request's sink (`step_stream.StepSink`)."""

    key: str
    sink: Any


def stream_into(backend, key: str, sink) -> None:
    """Mark a trace's backend (`served.ServeTrace`) as streamed: sent to STREAM_PATH, its steps into `sink`."""
    backend.stream = Target(key, sink)


async def outputs(trace, target: Target) -> AsyncIterator[Finished]:
    """`trace`'s stream (a ServeTrace): an unfinished output per step frame (its steps handed to the sink first),
    then the finished output, which is also left on `trace.output`."""
    from .served import finished

    framed = False
    async with contextlib.aclosing(trace.wire.astream(trace.client, trace.blob, target.key)) as frames:
        async for frame in frames:
            trace.blob, framed = None, True
            if isinstance(frame, dict) and "steps" in frame:
                for index, readout in frame["steps"] if target.sink is not None else ():
                    target.sink.readout(index, readout)       # StreamClosed when the reader left: the stream closes
                if frame.get("tokens") is not None:
                    yield Finished([Completion(list(frame["tokens"]))], finished=False)
                continue
            trace.output = finished(*read_answer(frame))
            yield trace.output
            return
    raise (StreamBroken if framed else Unreachable)(f"the engine service at {trace.wire.url} ended a stream "
                                                    "without its answer")


# -- frames ------------------------------------------------------------------------------------------------------

def framed(data: bytes) -> bytes:
    """One frame as it travels: its length, then its plain data."""
    return LENGTH.pack(len(data)) + data


async def frames_of(chunks: AsyncIterator[bytes]) -> AsyncIterator[Any]:
    """The frames in a stream of bytes, each read as plain data (NotPlain for anything else)."""
    buffer = bytearray()
    async for chunk in chunks:
        buffer += chunk
        while len(buffer) >= LENGTH.size:
            (size,) = LENGTH.unpack_from(buffer)
            if size > MAX_FRAME:
                raise NotPlain(f"a frame of {size} bytes")
            if len(buffer) < LENGTH.size + size:
                break
            frame = bytes(buffer[LENGTH.size:LENGTH.size + size])
            del buffer[:LENGTH.size + size]
            yield read_plain(frame)
    # bytes left over: a stream cut inside a frame, which its reader sees as a stream that ended without its answer

"""A generation's steps handed out as they are done, and a reader that leaves ends the work.

A backend writes a streamed request's steps into a `StepSink` from whatever thread it runs them on: each step's
readout (`readout`) and the tokens written so far (`tokens`), which arrive apart (vLLM says the tokens with
each step's output; the readouts come from its worker's outbox, `outbox.py`). The sink hands a `Step` on once
both its readout and its token are in, in order. A generation whose prompt is read apart (`parts.split_generation`)
gets its step 0 from those lens parts (`prompt`). When the request ends, its output (from the trace's saves) is
the authority: any step not handed on yet is handed on from it (`finish`), so a backend that cannot stream (a vLLM
worker without the outbox's method) streams every step at the end, and the stream's steps are always the output's.
Through an engine service the steps come as in-process: the service takes them and writes each as it comes
(`served_stream.py`), and a closed stream aborts the request there.

`Streaming` is the engine's side (`core.Engine` is one): `generate_steps` and `chat_steps` are generators that
yield each `Step`, then the output. Closing one before its end (a page closed, Stop, a client gone) cancels the
request at once: vLLM aborts it, the transformers backend's next write into the closed sink raises
`StreamClosed` and ends its generation; the slot and the turn are released, the call is counted `cancelled`.
The close itself waits for none of that: it may run on a thread that must not block (Gradio closes a generator
handler on its own event loop: `SyncToAsyncIterator.aclose`, gradio 6.31), so it schedules the cancel on the
engine's loop and returns; the call leaves the engine's admission (its place, its client's share) when its task on
that loop has ended, so what the engine counts as held is what it still holds.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, NamedTuple

from . import parts
from .errors import EngineTimeout, one_line
from .parts import Part, lens_part
from .protocol import ChatOutput, GenerationOutput, LensSpec, Sampling

log = logging.getLogger(__name__)


class StreamClosed(Exception):
    """The reader of a streamed request left: raised into a backend's generation to end it where it is."""


class Step(NamedTuple):
    """Step `index` of a streamed request: the token written there and the readout of the position that wrote
    it ({lens: Readout [L, P, ...]} for a generation, step 0 covering the prompt; (top ids, top probs) for a chat)."""

    index: int
    token_id: int
    readout: Any


class StepSink:
    """Where a backend writes a streamed request's steps (thread-safe). `emit(step)` must not block."""

    def __init__(self, emit: Callable[[Step], None], prompt_apart: bool = False):
        self._emit, self._prompt_apart = emit, prompt_apart
        self._lock = threading.Lock()
        self._readouts: dict[int, Any] = {}
        self._tokens: list[int] = []
        self._next = 0
        self.closed = False

    def readout(self, index: int, value) -> None:
        """Step `index`'s readout (a generation whose prompt is read apart: its own step 0 read nothing)."""
        self._check()
        if index == 0 and self._prompt_apart:
            return
        with self._lock:
            self._readouts.setdefault(int(index), value)
            self._hand_on()

    def prompt(self, value) -> None:
        """Step 0's readout, read apart (`parts.split_generation`)."""
        self._check()
        with self._lock:
            self._readouts[0] = value
            self._hand_on()

    def tokens(self, token_ids) -> None:
        """The tokens written so far (every one from the first)."""
        self._check()
        with self._lock:
            if len(token_ids) > len(self._tokens):
                self._tokens = [int(t) for t in token_ids]
                self._hand_on()

    def finish(self, token_ids, readouts) -> None:
        """The request's end: every step not handed on yet, from its output."""
        with self._lock:
            self._tokens = [int(t) for t in token_ids]
            for index in range(self._next, min(len(readouts), len(self._tokens))):
                self._readouts[index] = readouts[index]
            self._hand_on()

    def close(self) -> None:
        self.closed = True

    def _check(self) -> None:
        if self.closed:
            raise StreamClosed("the reader left")

    def _hand_on(self) -> None:
        while self._next in self._readouts and self._next < len(self._tokens):
            self._emit(Step(self._next, self._tokens[self._next], self._readouts.pop(self._next)))
            self._next += 1


@dataclass
class Call:
    """One admitted request: its future (the caller's side) and, once it runs, its task on the engine's loop."""

    client: str | None
    timeout: float
    future: concurrent.futures.Future | None = None
    task: asyncio.Task | None = None


_END = object()


class Streaming:
    """The engine's streamed generations (mixed into `core.Engine`, whose `submit`, `leave`, `_owner` and
    `max_part_cells` it uses)."""

    def generate_steps(self, spec: LensSpec, sampling: Sampling, timeout: float | None = None,
                       client: str | None = None) -> Iterator[Step | GenerationOutput]:
        """`Engine.generate`, streamed: each `Step` as it is done, then the GenerationOutput (equal to `generate`'s)."""
        prompt, gen = parts.split_generation(spec, self.max_part_cells)
        events: queue.SimpleQueue = queue.SimpleQueue()
        sink = StepSink(events.put, prompt_apart=bool(prompt))
        read: list = [None] * len(prompt)

        def prompt_part(i: int, piece: LensSpec) -> Part:
            async def run(backend):
                read[i] = await backend.run_lens(piece)
                if all(out is not None for out in read):
                    sink.prompt(parts.merge_lens(read).readouts)
                return read[i]
            return lens_part(piece)._replace(run=run)

        calls = [*(prompt_part(i, p) for i, p in enumerate(prompt)),
                 parts.generate_part(gen, sampling)._replace(run=lambda b: b.run_generate(gen, sampling, sink))]
        outs = yield from self._stream("generate", calls, sink, events, timeout, client)
        out = parts.merge_generation(outs[:-1], outs[-1])
        sink.finish(out.token_ids, out.steps)
        yield from _drained(events)
        yield out

    def chat_steps(self, spec: LensSpec, sampling: Sampling, timeout: float | None = None,
                   client: str | None = None) -> Iterator[Step | ChatOutput]:
        """`Engine.chat`, streamed: each `Step` (its readout: the top ids and probabilities as lists), then the
        ChatOutput (equal to `chat`'s)."""
        events: queue.SimpleQueue = queue.SimpleQueue()
        sink = StepSink(events.put)
        call = Part(lambda backend: backend.run_chat(spec, sampling, sink))
        out = (yield from self._stream("chat", [call], sink, events, timeout, client))[0]
        sink.finish(out.token_ids, list(zip(out.top_ids, out.top_probs)))
        yield from _drained(events)
        yield out

    def _stream(self, kind: str, calls: list[Part], sink: StepSink, events: queue.SimpleQueue,
                timeout: float | None, client: str | None):
        """Run `calls` as `client`'s request, yielding its steps as they come (chat steps as lists); its outputs."""
        call = self.submit(kind, calls, timeout, client)
        call.future.add_done_callback(lambda _: events.put(_END))
        try:
            while (item := events.get(timeout=call.timeout + 600)) is not _END:
                yield _plain(item)
            return call.future.result()
        except queue.Empty:
            raise EngineTimeout("the engine did not answer") from None
        finally:
            if call.future.done():
                self.leave(call)
            else:                               # the reader left (or the engine stopped answering)
                sink.close()
                self.cancel(call)

    def cancel(self, call: Call) -> None:
        """Cancel `call` on the engine's loop, and return at once: the call leaves the engine's admission when its
        task has ended there (a transformers generation ends at its next step, when its closed sink raises; a task
        waiting on vLLM at its next await). Nothing here waits for the engine's loop, which may be busy or held."""
        call.future.add_done_callback(lambda _: self.leave(call))      # at once if it has just ended
        try:
            self._owner.submit(lambda: cancel_task(call))
        except RuntimeError as e:           # the loop is closed: the engine closed, its calls cancelled with it
            log.warning("a closed stream's call was not cancelled: %s", one_line(e))


def _drained(events: queue.SimpleQueue) -> Iterator[Step]:
    """The steps `finish` handed on (the end marker already read)."""
    while True:
        try:
            item = events.get_nowait()
        except queue.Empty:
            return
        if item is not _END:
            yield _plain(item)


def _plain(step: Step) -> Step:
    """A chat step's readout (top ids, top probs) as lists, however the backend handed it."""
    if isinstance(step.readout, tuple):
        ids, probs = step.readout
        return step._replace(readout=([int(i) for i in ids], [float(p) for p in probs]))
    return step


def cancel_task(call: Call) -> None:
    """On the engine's loop: cancel `call`'s task (it lets go of its slot and turn as it unwinds). The task has
    started: the loop runs what it is given in order, and the call was given to it before its cancel."""
    task = call.task
    if task is not None and not task.done():
        task.cancel()


__all__ = ["Call", "ChatOutput", "GenerationOutput", "Step", "StepSink", "StreamClosed", "Streaming", "cancel_task"]

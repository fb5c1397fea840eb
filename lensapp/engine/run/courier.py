"""In the app's process: the steps vLLM's worker published for streamed requests, fetched while they run.

A streamed trace's body publishes each step's readout into the worker's outbox under its request's key
(`outbox.py`). The courier takes them with one `collective_rpc` (`outbox.TAKE`) whenever a streamed request's
output arrives (an engine step ended) and no take is on its way, and hands each step to its request's sink: one
call per engine step however many streams are open, which vLLM's engine core answers between two steps. Streams
that ended are forgotten in the worker at the next take (or at once, when none is left open).

A worker without the method (a vLLM worker class of another version) streams nothing: the take fails once, is
logged, and is not asked again; every step then arrives with its request's end (`step_stream.StepSink.finish`).
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import uuid
from typing import Awaitable, Callable

from .errors import one_line
from .outbox import TAKE

log = logging.getLogger(__name__)


class Courier:
    """`rpc(method, args)`: the engine's collective_rpc, a coroutine answering one payload per rank."""

    def __init__(self, rpc: Callable[..., Awaitable[list]]):
        self._rpc = rpc
        self._sinks: dict[str, object] = {}
        self._ended: set[str] = set()
        self._task: asyncio.Task | None = None
        self._again = False
        self.working = True

    def open(self, sink, key: str = "") -> str:
        """A key for a streamed request's trace to publish under (`key`: the one its trace was written with, on an
        engine service: `stream_route`), its steps handed to `sink`; "" when not streaming."""
        if not self.working:
            return ""
        key = key or uuid.uuid4().hex
        self._sinks[key] = sink
        return key

    def close(self, key: str) -> None:
        """The request under `key` ended: its steps left in the worker are dropped at the next take."""
        if key and self._sinks.pop(key, None) is not None:
            self._ended.add(key)
            if not self._sinks:
                self.kick()

    def kick(self) -> None:
        """An engine step ended: take what was published (now, or right after the take on its way)."""
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._task = asyncio.get_running_loop().create_task(self._fetch(), name="lens-courier")

    async def _fetch(self) -> None:
        while True:
            self._again = False
            forget, self._ended = tuple(self._ended), set()
            try:
                payloads = await self._rpc(TAKE, args=(forget,))
            except Exception as e:  # noqa: BLE001 - streaming is a convenience: steps come at the end without it
                self.working = False
                log.warning("the worker cannot hand out steps as they are done (%s); they come at the end", one_line(e))
                return
            for payload in payloads or ():
                if payload:
                    self._hand_out(pickle.loads(payload))
            if not self._again:
                return

    def _hand_out(self, published: dict[str, list]) -> None:
        for key, steps in published.items():
            sink = self._sinks.get(key)
            for index, readout in steps if sink is not None else ():
                try:
                    sink.readout(index, readout)
                except Exception as e:  # noqa: BLE001 - a reader gone (StreamClosed) or a bad step: its request ends
                    log.debug("a streamed step was not taken: %s", one_line(e))
                    break

"""The one owner of the model: one thread runs every trace, and a supervisor restarts a dead backend.

nnsight's client is not thread-safe, and a served app has many threads (Gradio's workers, a
workshop of thirty browsers). So one thread, owned by `Engine`, runs an event loop on which every
backend call is a coroutine (`OwnerThread`, at the end); callers on other threads submit a call and wait for
its result. On vLLM the coroutines of many callers are in flight at once and vLLM's scheduler batches them step
by step; on the transformers backend they run one after another.

Admission: a call is a request of one or more parts (each one engine request: a prompt's forward, a
generation). At most `max_batch` parts run at once, granted round-robin over the clients waiting
(`turns.py`: a client's parts hold at most `parts_per_client` slots, so a sweep's thirteen readouts
interleave with everyone else's); `max_batch + queue_size` calls may be admitted in all and
`per_client` per client, and the next caller is told at once that the app is busy. Every call has a
deadline, which the caller sets from its planned cost (`request_timeout` when it does not): past it,
the call alone is cancelled.

Supervision (`supervisor.py`): a backend that dies or stops stepping is restarted in this process.

Every admitted call ends in exactly one outcome, counted for /health: `served`, `failed` (its own
error: bad input the planner missed, an error inside the trace), `restarted` (the backend died or
stopped stepping under it), `timed_out` (its deadline passed) or `cancelled` (the app closed, or the
reader of a streamed generation left: `step_stream.py`).
`refused_busy` counts callers turned away at the door.

This module knows backends only through `protocol.Backend`: nothing of text, results or the UI, and
no backend by name.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections import Counter
from typing import Awaitable, Callable, Sequence, TypeVar

from . import parts
from .errors import EngineBusy, EngineDown, EngineError, EngineRestarted, EngineTimeout, one_line
from .parts import Part, generate_part, lens_part
from .protocol import (
    Backend,
    ChatOutput,
    ComponentsOutput,
    ComponentsSpec,
    GenerationOutput,
    JStack,
    LensOutput,
    LensSpec,
    ModelInfo,
    Sampling,
)
from .step_stream import Call, StreamClosed, Streaming
from .supervisor import Supervisor, close_quietly, dead
from .turns import Admission, FairSlots, OverShare

log = logging.getLogger(__name__)
T = TypeVar("T")

OUTCOMES = ("served", "failed", "restarted", "timed_out", "cancelled")


class Engine(Supervisor, Streaming):
    def __init__(self, start_backend: Callable[[], Backend], info: ModelInfo, *,
                 warm_up: Callable[[Backend], Awaitable[None]] | None = None,
                 jlens: JStack | None = None, max_batch: int = 16,
                 queue_size: int = 48, request_timeout: float = 120.0, stall_timeout: float = 120.0,
                 per_client: int = 4, parts_per_client: int = 2, max_part_cells: int = 1 << 30, max_restarts: int = 5,
                 restart_window: float = 600.0, watchdog_seconds: float = 2.0):
        self.info = info
        self.max_batch, self.queue_size, self.request_timeout = max_batch, queue_size, request_timeout
        self.stall_timeout, self.parts_per_client, self.max_part_cells = stall_timeout, parts_per_client, max_part_cells
        self._per_client = Admission(per_client)
        self.max_restarts, self.restart_window, self.watchdog_seconds = max_restarts, restart_window, watchdog_seconds
        self._start_backend, self._warm_up = start_backend, warm_up
        self._jlens = jlens                     # installed at every start
        self._backend: Backend | None = None
        self._generation = 0                    # bumped at every restart: stale failures restart nothing
        self._lock = threading.Lock()
        self._admitted = 0
        self.state, self.reason = "starting", ""
        self.started_at = time.time()
        self.restart_times: list[float] = []
        self.counts: Counter = Counter()        # OUTCOMES, refused_busy, forwards:<kind>
        self._in_flight = 0                     # parts running on the backend
        self._completed = 0                     # parts finished: progress the watchdog sees, with the backend's own
        self._running: set[asyncio.Task] = set()    # parts on the current backend, failed fast if it dies
        self._slots: FairSlots | None = None    # made with the first backend: its `concurrent` sets the size
        self._closed = False
        self._starting: concurrent.futures.Future | None = None     # a backend being built, off the loop
        self._builder = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="lens-engine-start")
        self._owner = OwnerThread("lens-engine")
        self._ready = self._owner.submit(asyncio.Event).result()
        self._booted = False

    def start(self) -> Engine:
        """Start the backend in the background (`wait_ready` or any call waits for it)."""
        if not self._booted:
            self._booted = True
            self._owner.submit(self._boot)
        return self

    # -- public, thread-safe --------------------------------------------------------------------------
    def lens(self, specs: list[LensSpec], timeout: float | None = None, client: str | None = None) -> list[LensOutput]:
        """Each prompt's readouts, each prompt (or each part of a large readout: `parts.py`) a part of the request,
        in flight together and taking turns with everyone else's."""
        cut = [parts.split_lens(spec, self.max_part_cells) for spec in specs]
        outs = iter(self.run("lens", [lens_part(p) for pieces in cut for p in pieces], timeout, client))
        return [parts.merge_lens([next(outs) for _ in pieces]) for pieces in cut]

    def generate(self, spec: LensSpec, sampling: Sampling, timeout: float | None = None,
                 client: str | None = None) -> GenerationOutput:
        return self.generate_all([spec], sampling, timeout, client)[0]

    def generate_all(self, specs: list[LensSpec], sampling: Sampling, timeout: float | None = None,
                     client: str | None = None) -> list[GenerationOutput]:
        """Several generations of one request (an intervention's before and after), each a part, each with its
        prompt's readout read apart in parts."""
        cut = [parts.split_generation(spec, self.max_part_cells) for spec in specs]
        calls = [call for prompt, gen in cut for call in [*map(lens_part, prompt), generate_part(gen, sampling)]]
        outs = iter(self.run("generate", calls, timeout, client))
        return [parts.merge_generation([next(outs) for _ in prompt], next(outs)) for prompt, _ in cut]

    def chat(self, spec: LensSpec, sampling: Sampling, timeout: float | None = None,
             client: str | None = None) -> ChatOutput:
        return self.call("chat", lambda b: b.run_chat(spec, sampling), timeout, client)

    def components(self, spec: ComponentsSpec, timeout: float | None = None,
                   client: str | None = None) -> ComponentsOutput:
        """One prompt's components readout: one engine request, taking its turn like any other."""
        return self.call("components", lambda b: b.run_components(spec), timeout, client)

    def set_jlens(self, stack: JStack) -> None:
        """Install a J stack now (when a backend is up) and after every restart."""
        self._jlens = stack
        if self.state == "ready":
            self.call("install", lambda b: b.install_jlens(stack))

    def wait_ready(self, timeout: float | None = None) -> None:
        """Block until the backend serves (EngineDown if it cannot start, EngineTimeout after `timeout`)."""
        self.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.state in ("starting", "restarting"):
            if deadline is not None and time.monotonic() > deadline:
                raise EngineTimeout(f"the model did not start within {timeout:g} s")
            time.sleep(0.1)
        if self.state == "down":
            raise EngineDown(f"the model is down: {self.reason}")

    def call(self, kind: str, fn: Callable[[Backend], Awaitable[T]], timeout: float | None = None,
             client: str | None = None) -> T:
        """Run `fn(backend)` on the engine's thread and wait for it: a request of one (small) part."""
        return self.run(kind, [Part(fn)], timeout, client)[0]

    def run(self, kind: str, parts: Sequence[Part], timeout: float | None = None,
            client: str | None = None) -> list[T]:
        """One request of `parts` (each one engine request), for `client` (its fair turn: turns.py; None, the
        host's): the one door into the backend. `timeout`: the request's deadline in seconds (`request_timeout`)."""
        call = self.submit(kind, parts, timeout, client)
        try:        # the loop enforces the deadline; this one only guards against a loop that no longer turns
            return call.future.result(timeout=call.timeout + 600)
        except TimeoutError:
            raise EngineTimeout("the engine did not answer") from None
        finally:
            self.leave(call)

    def submit(self, kind: str, parts: Sequence[Part], timeout: float | None = None,
               client: str | None = None) -> Call:
        """Admit `client`'s request of `parts` and start it on the loop (EngineBusy, EngineDown); `leave` it when
        done."""
        self.start()
        call = Call(client, timeout or self.request_timeout)
        with self._lock:
            if self.state == "down":
                raise EngineDown(f"the model is down: {self.reason}")
            if self._closed:
                raise EngineDown("the engine is closed")
            if self._admitted >= self.max_batch + self.queue_size:
                self.counts["refused_busy"] += 1
                raise EngineBusy(f"the app is busy ({self._admitted} requests ahead); try again in a moment")
            try:
                self._per_client.enter(call.client)
            except OverShare as e:
                self.counts["refused_busy"] += 1
                raise EngineBusy(str(e)) from None
            self._admitted += 1
            # scheduled under the lock: calls reach the loop in their order of arrival
            call.future = self._owner.submit(lambda: self._run(kind, parts, call))
        return call

    def leave(self, call: Call) -> None:
        with self._lock:
            self._admitted -= 1
            self._per_client.leave(call.client)

    def status(self) -> dict:
        """The state, its reason and the requests waiting (a page's status line), from counters only."""
        with self._lock:
            waiting = max(0, self._admitted - self._in_flight)
        return {"state": self.state, "reason": self.reason, "queue_depth": waiting}

    def idle(self) -> bool:
        """Ready, with nothing running or waiting (a look at two counters: cheap enough for every page asked for)."""
        with self._lock:
            return self.state == "ready" and self._admitted == 0 and self._in_flight == 0

    def health(self) -> dict:
        """A snapshot for /health: plain values only."""
        with self._lock:
            admitted = self._admitted
        return {"state": self.state, "reason": self.reason, "uptime_s": round(time.time() - self.started_at, 1),
                "restarts": len(self.restart_times), "in_flight": self._in_flight, "admitted": admitted,
                "queue_depth": max(0, admitted - self._in_flight),
                "parts_waiting": self._slots.waiting() if self._slots is not None else 0,
                "calls": {name: self.counts[name] for name in (*OUTCOMES, "refused_busy")},
                "forwards": {k.split(":", 1)[1]: v for k, v in self.counts.items() if k.startswith("forwards:")},
                **self._where()}

    def _where(self) -> dict:
        """What the start function says of where the model runs (engine services: each one's state), if anything:
        known while the backend is away too."""
        describe = getattr(self._start_backend, "describe", None)
        return describe() if describe is not None else {}

    def close(self) -> None:
        """Stop the loop and close the backend (vLLM's engine processes with it)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        backend, self._backend = self._backend, None
        if self._owner.is_running():
            if backend is not None:
                # On the loop: vLLM's async client closes its sockets there, and a socket left open makes
                # its zmq context hang the process at exit.
                try:
                    self._owner.submit(lambda: close_quietly(backend)).result(timeout=120)
                    backend = None
                except Exception as e:  # noqa: BLE001 - close it off the loop below, as well as it can be
                    log.warning("closing the backend on its loop: %s", one_line(e))
            self._owner.stop(timeout=30)         # the watchdog and calls left waiting cancelled, the thread joined
        if backend is not None:
            close_quietly(backend)
        starting = self._starting
        if starting is not None:          # a backend still being built: wait for it, so its processes close too
            try:
                close_quietly(starting.result(timeout=300))
            except Exception:  # noqa: BLE001 - it failed to start: nothing to close
                pass
        self._builder.shutdown(wait=False)

    # -- on the loop -------------------------------------------------------------------------------------
    async def _run(self, kind: str, parts, call: Call):
        """One admitted request, from waiting for the backend to its outcome (counted once, here)."""
        call.task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + call.timeout
        outcome = "failed"
        try:
            results = await asyncio.wait_for(gather_all(self._part(kind, part, call.client) for part in parts),
                                             max(0.0, deadline - loop.time()))
            outcome = "served"
            return results
        except asyncio.TimeoutError:
            outcome = "timed_out"
            raise EngineTimeout(f"the request took longer than its {call.timeout:.0f} s and was cancelled") from None
        except EngineRestarted:
            outcome = "restarted"
            raise
        except (asyncio.CancelledError, StreamClosed):        # the app closing, or a stream's reader gone
            outcome = "cancelled"
            raise
        finally:
            self.counts[outcome] += 1

    async def _part(self, kind: str, part: Part, client: str | None):
        """One part of a request: its turn for a slot, then its run on the backend that is up then."""
        await self._until_ready()
        async with self._slots.hold(client, part.cells, part.brief):
            while True:
                await self._until_ready()
                reason = self._backend.failure()
                if reason is None:
                    break
                self._restart_soon(self._generation, reason)    # died while idle: wait for the new one
            return await self._run_on(self._backend, self._generation, kind, part.run)

    async def _run_on(self, backend: Backend, generation: int, kind: str, fn):
        self._in_flight += 1
        self.counts[f"forwards:{kind}"] += 1
        task = asyncio.ensure_future(fn(backend))
        self._running.add(task)
        try:
            result = await task
        except asyncio.CancelledError:
            if generation == self._generation:
                raise                                    # cancelled from outside (its deadline, the app closing)
            raise EngineRestarted("the model restarted; please run again") from None    # see _restart_soon
        except Exception as e:
            reason = dead(e, backend)
            if reason is None:
                raise
            self._restart_soon(generation, reason)
            raise EngineRestarted("the model restarted; please run again") from None
        finally:
            self._in_flight -= 1
            self._running.discard(task)
        self._completed += 1
        return result


# -- the owner thread: it runs what it is given, knowing nothing of backends, requests, turns or restarts ---

class OwnerThread:
    """An event loop running on its own daemon thread, started when made."""

    def __init__(self, name: str = "lens-engine"):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def submit(self, make) -> concurrent.futures.Future:
        """Schedule `make()` (a coroutine factory, or a plain function) on the loop; a concurrent Future."""
        async def run():
            result = make()
            return await result if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future) else result
        return asyncio.run_coroutine_threadsafe(run(), self.loop)

    def is_running(self) -> bool:
        return self.loop.is_running()

    def stop(self, timeout: float = 30) -> None:
        """Cancel every task left on the loop (a watchdog, calls left waiting), then stop it and join its thread."""
        self.submit(_cancel_tasks).result(timeout=timeout)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=timeout)


async def _cancel_tasks() -> None:
    me = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not me]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def gather_all(coros) -> list:
    """Every coroutine's result, run at once. When one fails (a stream's reader gone) or this is cancelled, the others
    are cancelled and waited for: nothing of them is left running, holding a slot or counted in flight."""
    tasks = [asyncio.ensure_future(coro) for coro in coros]
    try:
        return await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


__all__ = ["OUTCOMES", "Engine", "EngineBusy", "EngineDown", "EngineError", "EngineRestarted", "EngineTimeout"]

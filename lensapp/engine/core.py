"""The one owner of the model: one thread runs every trace, and a supervisor restarts a dead backend.

nnsight's client is not thread-safe, and a served app has many threads (Gradio's workers, a
workshop of thirty browsers). So one thread, owned by `Engine`, runs an event loop on which every
backend call is a coroutine; callers on other threads submit a call and wait for its result. On
vLLM the coroutines of many callers are in flight at once and vLLM's scheduler batches them step
by step; on the transformers backend they run one after another.

Admission: at most `max_batch` calls run at once and `queue_size` more wait; the next caller is
told at once that the app is busy. Every call has a deadline (`request_timeout`).

Supervision: a backend is dead when a call's error is one its `is_dead` recognises, when its
`failure()` says so (checked every few seconds, so an idle app notices too), or when a call times
out while no other call finished (the engine is stuck). Then the engine restarts it in this
process: the old one is closed, a fresh one started, the Jacobian lens re-installed and the
warm-up run. Calls in flight get `EngineRestarted` ("please run again"); calls that were waiting
run on the new backend. Restarts back off; after `max_restarts` within `restart_window` seconds
the engine is `down` and says why. A start that fails for a reason that would repeat (`StartFailed`
with `permanent`, or a wrong layout or value) is not retried: the engine is down at once, with it.
A backend `served` from elsewhere (an engine service) is neither: while its service is away its start raises
`Unreachable`, and the engine waits (state `restarting`, the reason saying so) as long as it takes.

Every admitted call ends in exactly one outcome, counted for /health: `served`, `failed` (its own
error: bad input the planner missed, an error inside the trace), `restarted` (the backend died or
stopped answering under it), `timed_out` (its deadline passed while others progressed) or
`cancelled` (the app closed). `refused_busy` counts callers turned away at the door.

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
from typing import Awaitable, Callable, TypeVar

from .protocol import (
    Backend,
    ChatOutput,
    GenerationOutput,
    JStack,
    LensOutput,
    LensSpec,
    ModelInfo,
    Sampling,
    StartFailed,
    Unreachable,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

OUTCOMES = ("served", "failed", "restarted", "timed_out", "cancelled")
RESTART_DELAYS = (0.0, 5.0, 15.0, 30.0, 60.0)     # seconds before the n-th restart in a row
# Start failures that the same code and settings will meet again (a layout the model does not have, a bad
# value): the engine is down at once instead of retrying. Others (memory, a process that died) are retried.
PERMANENT = (ValueError, TypeError, AttributeError, KeyError, ImportError, NotImplementedError)


class EngineError(RuntimeError):
    """The engine could not serve a request; the message is one line meant for the user."""


class EngineBusy(EngineError):
    pass


class EngineRestarted(EngineError):
    pass


class EngineDown(EngineError):
    pass


class EngineTimeout(EngineError):
    pass


class Engine:
    def __init__(self, start_backend: Callable[[], Backend], info: ModelInfo, *,
                 warm_up: Callable[[Backend], Awaitable[None]] | None = None,
                 jlens: JStack | None = None, max_batch: int = 16,
                 queue_size: int = 48, request_timeout: float = 120.0, max_restarts: int = 5,
                 restart_window: float = 600.0, watchdog_seconds: float = 2.0):
        self.info = info
        self.max_batch, self.queue_size, self.request_timeout = max_batch, queue_size, request_timeout
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
        self._in_flight = 0
        self._running: set[asyncio.Task] = set()    # requests on the current backend, failed fast if it dies
        self._slots: asyncio.Semaphore | None = None    # made with the first backend: its `concurrent` sets the size
        self._last_completion = 0.0
        self._closed = False
        self._starting: concurrent.futures.Future | None = None     # a backend being built, off the loop
        self._builder = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="lens-engine-start")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="lens-engine", daemon=True)
        self._thread.start()
        self._ready = self._on_loop(self._make_event).result()
        self._booted = False

    def start(self) -> Engine:
        """Start the backend in the background (`wait_ready` or any call waits for it)."""
        if not self._booted:
            self._booted = True
            self._on_loop(self._boot)
        return self

    # -- public, thread-safe --------------------------------------------------------------------------
    def lens(self, specs: list[LensSpec]) -> list[LensOutput]:
        """Each prompt's readouts; the prompts of one request are in flight together."""
        return self.call("lens", lambda b: asyncio.gather(*(b.run_lens(s) for s in specs)))

    def generate(self, spec: LensSpec, sampling: Sampling) -> GenerationOutput:
        return self.call("generate", lambda b: b.run_generate(spec, sampling))

    def chat(self, spec: LensSpec, sampling: Sampling) -> ChatOutput:
        return self.call("chat", lambda b: b.run_chat(spec, sampling))

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

    def call(self, kind: str, fn: Callable[[Backend], Awaitable[T]]) -> T:
        """Run `fn(backend)` on the engine's thread and wait for it: the one door into the backend."""
        self.start()
        with self._lock:
            if self.state == "down":
                raise EngineDown(f"the model is down: {self.reason}")
            if self._closed:
                raise EngineDown("the engine is closed")
            if self._admitted >= self.max_batch + self.queue_size:
                self.counts["refused_busy"] += 1
                raise EngineBusy("the app is busy; try again in a moment")
            self._admitted += 1
            future = self._on_loop(lambda: self._run(kind, fn))    # under the lock: the loop sees arrival order
        try:
            # The loop enforces the deadline; this one only guards against a loop that no longer turns.
            try:
                return future.result(timeout=self.request_timeout + 600)
            except TimeoutError:
                raise EngineTimeout("the engine did not answer") from None
        finally:
            with self._lock:
                self._admitted -= 1

    def health(self) -> dict:
        """A snapshot for /health: plain values only."""
        with self._lock:
            admitted = self._admitted
        now = time.time()
        return {"state": self.state, "reason": self.reason, "uptime_s": round(now - self.started_at, 1),
                "restarts": len(self.restart_times), "in_flight": self._in_flight,
                "queue_depth": max(0, admitted - self._in_flight),
                "calls": {name: self.counts[name] for name in (*OUTCOMES, "refused_busy")},
                "forwards": {k.split(":", 1)[1]: v for k, v in self.counts.items() if k.startswith("forwards:")}}

    def close(self) -> None:
        """Stop the loop and close the backend (vLLM's engine processes with it)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        backend, self._backend = self._backend, None
        if self._loop.is_running():
            if backend is not None:
                # On the loop: vLLM's async client closes its sockets there, and a socket left open makes
                # its zmq context hang the process at exit.
                try:
                    self._on_loop(lambda: _close_quietly(backend)).result(timeout=120)
                    backend = None
                except Exception as e:  # noqa: BLE001 - close it off the loop below, as well as it can be
                    log.warning("closing the backend on its loop: %s", _one_line(e))
            self._on_loop(self._cancel_tasks).result(timeout=30)     # the watchdog, calls left waiting
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
        if backend is not None:
            _close_quietly(backend)
        starting = self._starting
        if starting is not None:          # a backend still being built: wait for it, so its processes close too
            try:
                _close_quietly(starting.result(timeout=300))
            except Exception:  # noqa: BLE001 - it failed to start: nothing to close
                pass
        self._builder.shutdown(wait=False)

    # -- on the loop -------------------------------------------------------------------------------------
    def _on_loop(self, make):
        """Schedule `make()` (a coroutine factory, or a plain function) on the loop; a concurrent Future."""
        async def run():
            result = make()
            return await result if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future) else result
        return asyncio.run_coroutine_threadsafe(run(), self._loop)

    @staticmethod
    async def _cancel_tasks() -> None:
        me = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not me]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    @staticmethod
    def _make_event() -> asyncio.Event:
        return asyncio.Event()

    async def _boot(self) -> None:
        asyncio.get_running_loop().create_task(self._watchdog())
        await self._start_with_retries("starting")

    async def _run(self, kind: str, fn):
        """One admitted call, from waiting for the backend to its outcome (counted once, here)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.request_timeout
        outcome = "failed"
        try:
            await asyncio.wait_for(self._until_ready(), max(0.0, deadline - loop.time()))
            async with self._slots:
                while True:
                    await asyncio.wait_for(self._until_ready(), max(0.0, deadline - loop.time()))
                    reason = self._backend.failure()
                    if reason is None:
                        break
                    self._restart_soon(self._generation, reason)    # died while idle: wait for the new one
                result = await self._run_on(self._backend, self._generation, kind, fn, deadline)
            outcome = "served"
            return result
        except asyncio.TimeoutError:
            outcome = "timed_out"
            raise EngineTimeout(f"the request took longer than {self.request_timeout:g} s and was cancelled") from None
        except EngineRestarted:
            outcome = "restarted"
            raise
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            self.counts[outcome] += 1

    async def _run_on(self, backend: Backend, generation: int, kind: str, fn, deadline: float):
        loop = asyncio.get_running_loop()
        started = loop.time()
        self._in_flight += 1
        self.counts[f"forwards:{kind}"] += 1
        task = asyncio.ensure_future(fn(backend))
        self._running.add(task)
        try:
            result = await asyncio.wait_for(task, max(0.0, deadline - loop.time()))
        except asyncio.CancelledError:
            if generation == self._generation:
                raise                                    # cancelled from outside (the app is closing)
            raise EngineRestarted("the model restarted; please run again") from None    # see _restart_soon
        except asyncio.TimeoutError:
            if self._last_completion < started:          # nothing finished meanwhile: the backend is stuck
                self._restart_soon(generation, f"a request made no progress for {loop.time() - started:.0f} s")
                raise EngineRestarted("the model was restarted (it stopped answering); please run again") from None
            raise
        except Exception as e:
            reason = _dead(e, backend)
            if reason is None:
                raise
            self._restart_soon(generation, reason)
            raise EngineRestarted("the model restarted; please run again") from None
        finally:
            self._in_flight -= 1
            self._running.discard(task)
        self._last_completion = loop.time()
        return result

    async def _until_ready(self) -> None:
        while self.state != "ready":
            if self.state == "down":
                raise EngineDown(f"the model is down: {self.reason}")
            self._ready.clear()
            await self._ready.wait()

    def _restart_soon(self, generation: int, reason: str) -> None:
        if generation != self._generation or self.state != "ready":
            return                                       # another caller saw the same death first
        log.error("the backend is dead (%s); restarting it", reason)
        self._generation += 1
        # Most requests on a dead vLLM get EngineDeadError at once, but one caught mid-submission can
        # wait forever for an output that never comes (seen: 1 in 8 at a SIGKILL, held to its 120 s deadline).
        for task in self._running:
            task.cancel()
        self._running.clear()
        self.state, self.reason = "restarting", reason
        asyncio.get_running_loop().create_task(self._restart())

    async def _restart(self) -> None:
        old, self._backend = self._backend, None
        if old is not None:
            await asyncio.get_running_loop().run_in_executor(None, _close_quietly, old)
        if getattr(old, "served", False):            # its service went away: reconnect, however often it does
            await self._start_with_retries("restarting")
            return
        now = time.time()
        recent = [t for t in self.restart_times if now - t < self.restart_window]
        if len(recent) >= self.max_restarts:
            self._go_down(f"{len(recent)} restarts within {self.restart_window / 60:.0f} minutes; last cause: "
                          f"{self.reason}")
            return
        self.restart_times.append(now)
        await asyncio.sleep(RESTART_DELAYS[min(len(recent), len(RESTART_DELAYS) - 1)])
        await self._start_with_retries("restarting")

    async def _start_with_retries(self, state: str) -> None:
        self.state = state
        for attempt in range(self.max_restarts):
            try:
                await self._start_when_reachable()
                return
            except Exception as e:  # noqa: BLE001 - a failure to start is retried (when it can pass), then reported
                permanent = isinstance(e, PERMANENT) or getattr(e, "permanent", False)
                if isinstance(e, StartFailed):
                    log.error("starting the backend failed (attempt %d): %s", attempt + 1, e)
                else:
                    log.exception("starting the backend failed (attempt %d)", attempt + 1)
                self.reason = f"the model could not start: {e if isinstance(e, StartFailed) else _one_line(e)}"
                if permanent:
                    break                                # the same start would fail the same way
                await asyncio.sleep(RESTART_DELAYS[min(attempt + 1, len(RESTART_DELAYS) - 1)])
        self._go_down(self.reason)

    async def _start_when_reachable(self) -> None:
        """Start, waiting out a served backend's absence (`Unreachable`) however long it lasts."""
        while True:
            try:
                return await self._start_once()
            except Unreachable as e:
                self.reason = str(e)
                await asyncio.sleep(e.retry_after)

    async def _start_once(self) -> None:
        t = time.perf_counter()
        self._starting = self._builder.submit(self._start_backend)
        backend = await asyncio.wrap_future(self._starting)
        self._starting = None
        try:
            if self._jlens is not None:
                await backend.install_jlens(self._jlens)
            if self._warm_up is not None:
                await self._warm_up(backend)
        except Exception as e:
            # before closing (a closed backend says only that); a served one's service gone again: wait for it
            reason = None if isinstance(e, Unreachable) else _dead(e, backend)
            _close_quietly(backend)
            if reason is not None:                       # it died on its first requests: so it would again
                raise StartFailed(f"it died on its first request: {reason}") from e
            raise
        except BaseException:
            _close_quietly(backend)
            raise
        if self._slots is None:                          # one at a time unless the backend batches
            self._slots = asyncio.Semaphore(self.max_batch if backend.concurrent else 1)
        if self._closed:
            _close_quietly(backend)
            return
        self._backend, self.state = backend, "ready"
        self._ready.set()
        log.info("the model is ready (%.1f s)", time.perf_counter() - t)

    def _go_down(self, reason: str) -> None:
        log.error("the model is down: %s", reason)
        self.state, self.reason = "down", reason
        self._ready.set()                                # waiting callers wake up and are told

    async def _watchdog(self) -> None:
        while True:
            await asyncio.sleep(self.watchdog_seconds)
            backend = self._backend
            if self.state == "ready" and backend is not None:
                reason = backend.failure()
                if reason:
                    self._restart_soon(self._generation, reason)


def _dead(error: BaseException, backend: Backend) -> str | None:
    """Why `error` means the backend is dead, or None when it is this request's own failure."""
    return backend.is_dead(error) or backend.failure()


def _close_quietly(backend: Backend) -> None:
    try:
        backend.close()
    except Exception as e:  # noqa: BLE001 - a dead backend may fail to close; it is gone either way
        log.warning("closing the old backend: %s", _one_line(e))


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__

"""The supervisor: starts the backend, watches it, and restarts it when it dies or stops stepping.

A backend is dead when a call's error is one its `is_dead` recognises, when its `failure()` says so
(checked every few seconds, so an idle app notices too), or when no engine step finished for
`stall_timeout` seconds while work was in flight (the engine is stuck; a long request is not: its steps
go on finishing, `Backend.progress`). Then the engine restarts it in this process: the old one is
closed, a fresh one started, the Jacobian lens re-installed and the warm-up run. Calls in flight get
`EngineRestarted` ("please run again"); calls that were waiting run on the new backend. Restarts back
off; after `max_restarts` within `restart_window` seconds the engine is `down` and says why. A start
that fails for a reason that would repeat (`StartFailed` with `permanent`, or a wrong layout or value)
is not retried: the engine is down at once, with it. A backend `served` from elsewhere (an engine
service) is neither: while its service is away its start raises `Unreachable`, and the engine waits
(state `restarting`, the reason saying so) as long as it takes, counting no restart.

The engine (`core.py`) is a Supervisor: this holds the backend's life, that module the requests' path.
"""

from __future__ import annotations

import asyncio
import logging
import time

from . import parts
from .errors import EngineDown, one_line
from .protocol import Backend, StartFailed, Unreachable
from .turns import FairSlots

log = logging.getLogger(__name__)

RESTART_DELAYS = (0.0, 5.0, 15.0, 30.0, 60.0)     # seconds before the n-th restart in a row
# Start failures that the same code and settings will meet again (a layout the model does not have, a bad
# value): the engine is down at once instead of retrying. Others (memory, a process that died) are retried.
PERMANENT = (ValueError, TypeError, AttributeError, KeyError, ImportError, NotImplementedError)
STALL_CEILING = 5              # a busy engine may go this many stall_timeouts without finishing a step
CPU_MOVED = 0.5                # CPU seconds that count as work (a stuck process still ticks a little)


class Supervisor:
    """The backend's life on the engine's loop. The engine sets what these read: _backend, _generation,
    state, reason, _ready, _running, _slots, _jlens, _warm_up, _start_backend, _builder, _starting, _closed,
    restart_times, max_restarts, restart_window, stall_timeout, watchdog_seconds, _in_flight, _completed."""

    # The tasks this starts, kept: the loop holds a task only weakly, and one collected mid-way vanishes silently.
    _watchdog_task: asyncio.Task | None = None
    _restart_task: asyncio.Task | None = None

    async def _boot(self) -> None:
        self._watchdog_task = _spawn(self._watchdog(), "lens-watchdog")
        await self._start_with_retries("starting")

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
        self._restart_task = _spawn(self._restart(), "lens-restart")

    async def _restart(self) -> None:
        old, self._backend = self._backend, None
        if old is not None:
            await asyncio.get_running_loop().run_in_executor(None, close_quietly, old)
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
                self.reason = f"the model could not start: {e if isinstance(e, StartFailed) else one_line(e)}"
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
            reason = None if isinstance(e, Unreachable) else dead(e, backend)
            close_quietly(backend)
            if reason is not None:                       # it died on its first requests: so it would again
                raise StartFailed(f"it died on its first request: {reason}") from e
            raise
        except BaseException:
            close_quietly(backend)
            raise
        if self._slots is None:                          # one at a time unless the backend batches
            size = self.max_batch if backend.concurrent else 1
            self._slots = FairSlots(size, min(self.parts_per_client, size), parts.big_cells(self.max_part_cells))
        if self._closed:
            close_quietly(backend)
            return
        self._backend, self.state = backend, "ready"
        self._ready.set()
        log.info("the model is ready (%.1f s)", time.perf_counter() - t)

    def _go_down(self, reason: str) -> None:
        log.error("the model is down: %s", reason)
        self.state, self.reason = "down", reason
        self._ready.set()                                # waiting callers wake up and are told

    async def _watchdog(self) -> None:
        """Every few seconds: a backend that says it died is restarted, and so is one that is stuck: parts in
        flight, and neither a step finished nor CPU time spent by its processes for `stall_timeout` seconds (or
        no step finished for STALL_CEILING times that, however busy it looks). A long request keeps stepping,
        and one long step (many heavy parts at once on a crowded CPU) keeps its processes busy: neither is
        taken for a stuck engine. A look that fails (a backend's `failure()` or `progress()` raising) is logged,
        once for each kind of error, and the watch goes on: the engine is never left unwatched."""
        loop = asyncio.get_running_loop()
        watch = _Stall()
        failed: set[str] = set()             # the kinds of error already logged
        while True:
            await asyncio.sleep(self.watchdog_seconds)
            try:
                watch = self._look(loop.time(), watch, failed)
            except Exception as e:  # noqa: BLE001 - one failed look must not end the watch; the next one may pass
                _note(e, failed)

    def _look(self, now: float, watch: _Stall, failed: set[str]) -> _Stall:
        """One look at the backend: restart it if it died or is stuck; the stall watch to keep."""
        backend = self._backend
        if self.state != "ready" or backend is None:
            return _Stall()
        try:
            reason = backend.failure()
        except Exception as e:  # noqa: BLE001 - it cannot say whether it died: whether it steps is still watched
            _note(e, failed)
            reason = None
        if reason:
            self._restart_soon(self._generation, reason)
            return watch
        progress = backend.progress()
        stuck = watch.update(now, self._generation, self._in_flight, progress.steps + self._completed,
                             progress.cpu_seconds, self.stall_timeout)
        if stuck:
            self._restart_soon(self._generation, stuck)
            return _Stall()
        return watch


def _note(error: Exception, failed: set[str]) -> None:
    """Log a failed look at the backend, once for each kind of error (a look every few seconds would flood the log)."""
    kind = f"{type(error).__module__}.{type(error).__qualname__}"
    if kind not in failed:
        failed.add(kind)
        log.error("the watchdog's look at the backend failed (logged once for each kind of error); it keeps "
                  "watching", exc_info=error)


class _Stall:
    """When a backend's steps and its processes' CPU time last moved while parts were in flight."""

    def __init__(self):
        self.generation, self.steps, self.cpu = None, None, None
        self.step_at = self.cpu_at = 0.0

    def update(self, now: float, generation: int, in_flight: int, steps: int, cpu: float,
               stall_timeout: float) -> str | None:
        """Why the backend is stuck, or None."""
        if in_flight == 0 or generation != self.generation:
            self.generation, self.steps, self.cpu, self.step_at, self.cpu_at = generation, steps, cpu, now, now
            return None
        if steps != self.steps:
            self.steps, self.step_at, self.cpu_at = steps, now, now
        if cpu > (self.cpu or 0.0) + CPU_MOVED:
            self.cpu, self.cpu_at = cpu, now
        if now - self.cpu_at > stall_timeout:
            return f"no engine step finished and its processes were idle for {now - self.cpu_at:.0f} s"
        if now - self.step_at > STALL_CEILING * stall_timeout:
            return f"no engine step finished in {now - self.step_at:.0f} s"
        return None


def _spawn(coro, name: str) -> asyncio.Task:
    """A task on the running loop whose unexpected end is logged (asyncio would say so only when it is collected)."""
    task = asyncio.get_running_loop().create_task(coro, name=name)
    task.add_done_callback(_report_end)
    return task


def _report_end(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("the engine's %s task ended with an error", task.get_name(), exc_info=task.exception())


def dead(error: BaseException, backend: Backend) -> str | None:
    """Why `error` means the backend is dead, or None when it is this request's own failure."""
    return backend.is_dead(error) or backend.failure()


def close_quietly(backend: Backend) -> None:
    try:
        backend.close()
    except Exception as e:  # noqa: BLE001 - a dead backend may fail to close; it is gone either way
        log.warning("closing the old backend: %s", one_line(e))

"""Many engine services behind one page (`--engine-url URL1,URL2,...`): `Engines`, the pool its traces go through.

`Engines` offers what a page's model uses of one `served.Wire` (`apost`, `post`, `async_client`, `health`,
`progress`), so `served.ServedVLLM` and `ServeTrace` send through it unchanged. Each trace goes to the engine that
is up with the fewest of this page's traces in flight (ties: the one listed first): a count kept here, so it costs
no look at the engines and sees every trace the moment it leaves (other pages' traces on a shared engine it does
not see: those the engine's 429 covers). Where there are several engines the trace carries `served.BUSY_HEADER`:
a full engine answers 429 at once (`engine_service.BusyDoor`) and the next least loaded is asked; when every
engine said so, the trace waits on the least loaded one, sent without the header. That is Neuronpedia's scheme
(`fail_if_busy` to each host, then a fallback that waits).

An engine that does not answer (a connection error, a 503, its vLLM engine dead under the trace) is left out at
once, and the trace is asked again on another: a trace is pure (a readout, or a generation whose seed is drawn
in the page before it is sent: `remote_backend.seeded`), so asking again gives the same answer. Only when no
engine is up does the caller see `Unreachable` (the page's supervisor then waits and reconnects), and only once
none has been up for GRACE_S: one address may front many replicas (Ray Serve's proxy, `lensapp engine
--replicas`), and the trace that lost its replica there is answered by another once the watcher's next look finds
the address answering again. Until then a trace waits for an engine (`_pick`), as does the page (`failure`).

A left-out engine is looked at by its own watcher thread (`watch`) every POLL_SECONDS; once its `/health`
answers, it is given back only after `admit(wire)` (the backend's: the model checked, the page's Jacobian lens
installed) passes. An engine that is up is watched the same way, and is left out after MISSES failed looks; each
look also reads its vLLM processes' CPU time (`progress`, summed over the engines: the stall watch).

A stream goes through `stream(open_stream)`: moved like a trace until its first frame, and not after (its frames
were given out). Both are made of `pick` and `release`: `pick(tried)` chooses an engine and counts the request
in flight on it; `release(pick, error)` counts it out and says whether to ask another (the engine was full or
gone: `Busy`, `Unreachable`).

This module knows nothing of traces' contents, lenses or the page: it chooses engines and counts.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import AsyncIterator, Awaitable, Callable, Sequence, TypeVar
from urllib.parse import urlsplit

from .protocol import StartFailed, Unreachable
from .served import ENGINE_DEAD, Busy, Wire

log = logging.getLogger(__name__)
T = TypeVar("T")

POLL_SECONDS = 2.0       # between two looks at an engine's /health
MISSES = 2               # looks in a row that must fail before an engine that is up is left out
GRACE_S = 20.0           # none up for this long is the page's engine gone (`failure`); until then traces wait
WAIT_S = 0.25            # between two looks for an engine by a trace that waits for one


@dataclass(eq=False)
class Replica:
    """One engine service of the pool and what this page has seen of it."""

    wire: Wire
    up: bool = False
    reason: str = "not looked at yet"      # why it is out, while it is
    in_flight: int = 0                     # this page's requests on it now
    answered: int = 0                      # requests it answered
    failed_over: int = 0                   # requests moved off it because it did not answer
    busy: int = 0                          # requests it sent elsewhere at once, full (429)
    cpu_seconds: float = 0.0               # its vLLM processes' CPU time, at the last look

    def health(self) -> dict:
        parts = urlsplit(self.wire.url)    # an address as given, without any user:password in it
        url = parts._replace(netloc=parts.hostname + (f":{parts.port}" if parts.port else "")).geturl() \
            if parts.hostname else self.wire.url
        return {"url": url, "up": self.up, "in_flight": self.in_flight, "answered": self.answered,
                "failed_over": self.failed_over, "busy": self.busy, **({} if self.up else {"reason": self.reason})}


@dataclass(frozen=True)
class Pick:
    """A request's engine, and whether to send it with BUSY_HEADER (another engine is left to ask)."""

    replica: Replica
    fail_if_busy: bool

    @property
    def wire(self) -> Wire:
        return self.replica.wire


@dataclass(eq=False)
class Engines:
    """The engine services a page sends its traces to, in the order given."""

    replicas: list[Replica]
    # Held while an engine is admitted, and by whoever changes what `admit` gives each (a new J stack), so that
    # change reaches every engine that is up, or is made before the next one is admitted.
    admitting: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)     # the counts and up/out
    _stop: threading.Event | None = field(default=None, repr=False)
    grace_s: float = GRACE_S
    _none_up_since: float | None = field(default=None, repr=False)     # monotonic; None while one is up

    @classmethod
    def of(cls, urls: Sequence[str], key: str) -> Engines:
        if not urls:
            raise ValueError("an engine pool needs at least one engine service")
        return cls([Replica(Wire(url, key)) for url in urls])

    @property
    def url(self) -> str:
        """Every engine's address (for a log line)."""
        return ", ".join(r.wire.url for r in self.replicas)

    # -- choosing -------------------------------------------------------------------------------------
    def pick(self, tried: Sequence[Replica] = ()) -> Pick:
        """The up engine with the fewest in flight not yet `tried` (asked with BUSY_HEADER); when every up engine
        was tried (all full), the least loaded up one (asked to wait). Counted in flight on it until `release`.
        `Unreachable` when none is up."""
        with self._lock:
            up = [r for r in self.replicas if r.up]
            if not up:
                raise Unreachable(self.none_up())
            fresh = [r for r in up if r not in tried]
            replica = min(fresh or up, key=lambda r: r.in_flight)      # min keeps the first of equals
            replica.in_flight += 1
            # One engine alone has nowhere else to send it: it waits there at once.
            return Pick(replica, fail_if_busy=bool(fresh) and len(up) > 1)

    def release(self, pick: Pick, error: BaseException | None = None, movable: bool = True) -> bool:
        """Count the request out of its engine: answered (no `error`), or not. True when it should be asked again
        elsewhere: the engine was full (`Busy`), did not answer (`Unreachable`: it is left out from now on), or
        failed as a service (a non-200 that is not the trace's own error: another may not). A request that can
        no longer move (a stream past its first frame: not `movable`) is not counted as moved."""
        replica = pick.replica
        with self._lock:
            replica.in_flight -= 1
            if error is None:
                replica.answered += 1
                return False
            if isinstance(error, Unreachable):
                self._left_out(replica, str(error))
            if isinstance(error, Busy):
                replica.busy += 1
                return True
            if movable and isinstance(error, StartFailed) and (isinstance(error, Unreachable) or not error.permanent):
                replica.failed_over += 1
                return True
        return False

    async def ask(self, attempt: Callable[[Wire, bool], Awaitable[T]]) -> T:
        """`attempt(wire, fail_if_busy)` on the engine `pick` gives, then on the next while one is full or gone; an
        error raised when asking again would not help (the trace's own, or each engine failed it)."""
        tried: list[Replica] = []
        while True:
            pick = await self._pick(tried)
            try:
                result = await attempt(pick.wire, pick.fail_if_busy)
            except BaseException as e:
                if not self._again(pick, e, tried):
                    raise
                continue
            self.release(pick)
            return result

    async def _pick(self, tried: list[Replica]) -> Pick:
        """`pick`, waiting while no engine is up and the page's engine is not yet gone (`failure`): a replica
        behind the same address, or a restarted engine, may take the trace."""
        while True:
            try:
                return self.pick(tried)
            except Unreachable:
                if self.failure():
                    raise
            await asyncio.sleep(WAIT_S)

    def _again(self, pick: Pick, error: BaseException, tried: list[Replica]) -> bool:
        """`release` after `error`: whether to ask another engine. Not after a failure on an engine this request
        already tried (every engine failed it); an engine gone is left out, so asking on ends."""
        again = self.release(pick, error) and (isinstance(error, Unreachable) or pick.replica not in tried)
        tried.append(pick.replica)
        return again

    async def stream(self, open_stream: Callable[[Wire, bool], AsyncIterator[T]]) -> AsyncIterator[T]:
        """The frames of `open_stream(wire, fail_if_busy)` (an async generator: a streamed trace) on the engine
        `pick` gives, moved to the next while one is full or gone before its first frame; after that it cannot
        move (frames were given out), and its error is the caller's."""
        tried: list[Replica] = []
        while True:
            pick = await self._pick(tried)
            frames = open_stream(pick.wire, pick.fail_if_busy)
            try:
                first = await anext(frames)
            except StopAsyncIteration:
                self.release(pick)
                return
            except BaseException as e:
                await frames.aclose()
                if not self._again(pick, e, tried):
                    raise
                continue
            break
        try:
            yield first
            async for frame in frames:
                yield frame
        except BaseException as e:
            self.release(pick, e, movable=False)
            raise
        finally:
            await frames.aclose()
        self.release(pick)

    # -- a Wire's interface, through the pool ------------------------------------------------------------
    def astream(self, client, blob: bytes, stream_key: str):
        """`Wire.astream` through the pool (served_stream.py): moved before its first frame only (`stream`)."""
        return self.stream(lambda wire, fail_if_busy: wire.astream(client, blob, stream_key, fail_if_busy))

    async def apost(self, client, blob: bytes) -> tuple[dict, object]:
        async def attempt(wire: Wire, fail_if_busy: bool):
            return alive(wire, await wire.apost(client, blob, fail_if_busy))
        return await self.ask(attempt)

    def post(self, blob: bytes) -> tuple[dict, object]:
        """`apost`, waiting here (a thread that is not the engine's loop)."""
        tried: list[Replica] = []
        while True:
            pick = self.pick(tried)
            try:
                answer = alive(pick.wire, pick.wire.post(blob, pick.fail_if_busy))
            except BaseException as e:
                if not self._again(pick, e, tried):
                    raise
                continue
            self.release(pick)
            return answer

    def async_client(self):
        return self.replicas[0].wire.async_client()     # httpx's client: any address, its connections kept each

    def health(self) -> None:
        """Unreachable unless an engine is up."""
        if not any(r.up for r in self.replicas):
            raise Unreachable(self.none_up())

    def progress(self) -> float:
        """The CPU seconds the engines' vLLM processes have spent, summed (at each one's last look)."""
        return sum(r.cpu_seconds for r in self.replicas)

    # -- up and out ----------------------------------------------------------------------------------------
    def admit_all(self, admit: Callable[[Wire], None]) -> list[StartFailed | None]:
        """Look at every engine now (at connect): each one that answers and passes `admit` is up; what kept each
        other one out."""
        return [self._look(replica, admit) for replica in self.replicas]

    def watch(self, admit: Callable[[Wire], None]) -> None:
        """A thread per engine looking at it every POLL_SECONDS until `stop`, admitting it (`admit`) when it
        answers again."""
        self.stop()
        stop = self._stop = threading.Event()
        for replica in self.replicas:
            threading.Thread(target=self._watch, args=(replica, admit, stop), daemon=True,
                             name=f"lens-engine-watch-{replica.wire.url}").start()

    def stop(self) -> None:
        if self._stop is not None:
            self._stop.set()

    def any_up(self) -> bool:
        return any(r.up for r in self.replicas)

    def failure(self) -> str | None:
        """Why no engine serves, when none has been up for `grace_s` (or none ever was)."""
        since = self._none_up_since
        if self.any_up() or (since is not None and time.monotonic() - since < self.grace_s):
            return None
        return self.none_up()

    def none_up(self) -> str:
        reasons = "; ".join(r.reason for r in self.replicas)
        return f"no engine service answers ({reasons})" if len(self.replicas) > 1 else reasons

    def describe(self) -> list[dict]:
        """Each engine, for the host's /health."""
        with self._lock:
            return [r.health() for r in self.replicas]

    def _watch(self, replica: Replica, admit, stop: threading.Event) -> None:
        misses = 0
        while not stop.wait(POLL_SECONDS):
            if not replica.up:
                self._look(replica, admit)
                continue
            try:
                replica.wire.health()
                replica.cpu_seconds = replica.wire.progress()
                misses = 0
            except (Unreachable, StartFailed) as e:
                misses += 1
                if misses >= MISSES:
                    self.leave_out(replica, str(e))
                    misses = 0

    def _look(self, replica: Replica, admit) -> StartFailed | None:
        """An engine that is out: in again once it answers and `admit` passes; why not, if not."""
        try:
            replica.wire.health()
            with self.admitting:           # admitted and up at once: what admit installs is on every up engine
                admit(replica.wire)
                cpu = replica.wire.progress()
                with self._lock:
                    replica.up, replica.reason, replica.cpu_seconds = True, "", cpu
                    self._none_up_since = None
        except (Unreachable, StartFailed) as e:
            if replica.reason != str(e):
                log.warning("engine service %s is out: %s", replica.wire.url, e)
            self.leave_out(replica, str(e))
            return e
        log.info("engine service %s is up", replica.wire.url)
        return None

    def leave_out(self, replica: Replica, reason: str) -> None:
        """Out until its watcher admits it again."""
        with self._lock:
            self._left_out(replica, reason)

    def _left_out(self, replica: Replica, reason: str) -> None:
        """(Under the lock.) Out until its watcher admits it again."""
        if replica.up:
            log.error("engine service %s left out: %s", replica.wire.url, reason)
            if not any(r.up for r in self.replicas if r is not replica):
                self._none_up_since = time.monotonic()
        replica.up, replica.reason = False, reason


def alive(wire: Wire, answer: tuple[dict, object]) -> tuple[dict, object]:
    """An answer, unless it says the service's vLLM engine died under the trace: that engine is gone (`Unreachable`,
    and the trace is asked elsewhere)."""
    error = answer[1]
    if error and error.get("type_name") in ENGINE_DEAD:
        raise Unreachable(f"the engine service at {wire.url}: its vLLM engine died ({error.get('type_name')})")
    return answer

"""Fair turns: many clients, one engine; nobody waits behind one client's minutes of work.

A client is whoever the service says is asking (each engine call's `client`: a visitor's address, or a
person's key behind one); None is the host itself (the command line, the front page's examples, a loopback caller),
which no per-client bound applies to. The engine counts a request's admission in `Admission` (on the
caller's thread) and runs each of its parts (one engine request: a prompt's forward, a generation)
in a slot of `FairSlots` (on the engine's loop):

- a client may have `per_client` requests admitted (running or waiting); one more is refused at once
  with its place ("busy"), never silently delayed;
- a client's parts hold at most `parts_per_client` slots at once, so a sweep of 13 readouts runs two
  by two, and every other client's next part is granted between them: a free slot goes to the waiting
  client that holds fewest, then to the one whose turn came longest ago (round-robin);
- one big part (a quarter of the largest part or more: `parts.big_cells`) runs at a time, whoever's it is, so a
  step holds at most one, and a small request never waits behind several;
- when the big turn comes free while a brief part (a small lens: one engine step) runs, the next big part waits
  for it, at most BIG_PATIENCE: a big part granted then would join that lens's step and make it seconds long.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import Counter, deque

_NOBODY = object()
# Seconds the big turn stays free for brief parts running when it comes free: about one light step under load
# here. Counted from when the turn came free, not from a big part's arrival (big parts wait their turn for
# minutes under load: counted from then, the patience was always spent, run H in bench/RESULTS.md).
BIG_PATIENCE = 1.0


class OverShare(RuntimeError):
    """A client asked for more than its share; the message says where it stands, in one line."""


class Admission:
    """Requests admitted per client (thread-safe): at most `per_client` each; the host is not bounded."""

    def __init__(self, per_client: int):
        self.per_client = per_client
        self._admitted: Counter = Counter()
        self._lock = threading.Lock()

    def enter(self, client: str | None) -> None:
        with self._lock:
            if client is not None and self._admitted[client] >= self.per_client:
                raise OverShare(f"you already have {self._admitted[client]} requests running or waiting here "
                                f"(the most one visitor may have); run this again when one has finished")
            self._admitted[client] += 1

    def leave(self, client: str | None) -> None:
        with self._lock:
            self._admitted[client] -= 1
            if self._admitted[client] <= 0:
                del self._admitted[client]


class FairSlots:
    """`size` slots granted round-robin over the clients waiting for one; a client (not the host) holds at
    most `per_client` at once, and at most one *big* part (reading `big_cells` cells or more) runs at once.
    Lives on one event loop; `hold(client, cells)` is an async context manager.

    Why one big part: vLLM runs every request in flight in the same step, and a step lasts as long as the
    readouts inside it (a part of 4096 cells is seconds on a CPU). Two or three big parts in one step made
    every small request beside them (a visitor's short lens, a generation's next token) wait for all of
    them; with one, a small request waits for at most one big part, and big parts take turns among
    themselves while small ones keep flowing past them.
    """

    def __init__(self, size: int, per_client: int, big_cells: int = 0):
        self.size, self.per_client, self.big_cells = size, per_client, big_cells
        self.free = size
        self.big = 0                                      # big parts holding a slot (0 or 1)
        self.brief = 0                                    # brief small parts (a lens) holding a slot
        self._big_freed = -float("inf")                   # when the big turn last came free (time.monotonic)
        self._wake = None                                 # the timer that grants a held big part its turn
        self.held: Counter = Counter()
        self._waiting: dict[str | None, deque[tuple[asyncio.Future, bool]]] = {}
        self._turns: deque[str | None] = deque()          # clients with waiters, whose turn is next first

    @contextlib.asynccontextmanager
    async def hold(self, client: str | None, cells: int = 0, brief: bool = False):
        """`brief`: the part is done in one engine step (a lens, not a generation)."""
        big = self.is_big(cells)
        await self.acquire(client, big)
        brief = brief and not big
        self.brief += brief
        try:
            yield
        finally:
            self.brief -= brief
            self.release(client, big)

    def is_big(self, cells: int) -> bool:
        return 0 < self.big_cells <= cells

    async def acquire(self, client: str | None, big: bool = False) -> None:
        granted = asyncio.get_running_loop().create_future()
        if client not in self._waiting:
            self._waiting[client] = deque()
            self._turns.append(client)
        self._waiting[client].append((granted, big))
        self._grant()
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self.release(client, big)                  # granted just as it was cancelled: give it back
            else:
                self._forget(client, granted)
            raise

    def release(self, client: str | None, big: bool = False) -> None:
        self.free += 1
        self.big -= big
        if big:
            self._big_freed = time.monotonic()
        self.held[client] -= 1
        if self.held[client] <= 0:
            del self.held[client]
        self._grant()

    def waiting(self) -> int:
        return sum(len(q) for q in self._waiting.values())

    def _may_hold(self, client: str | None, big: bool) -> bool:
        if client is not None and self.held[client] >= self.per_client:
            return False
        return not big or (not self.big and not self._brief_first())

    def _brief_first(self) -> bool:
        """Whether the big turn, free now, is kept for the brief parts running (and a wake-up set for its end)."""
        left = BIG_PATIENCE - (time.monotonic() - self._big_freed)
        if not self.brief or left <= 0:
            return False
        if self._wake is None:
            self._wake = asyncio.get_running_loop().call_later(left, self._woken)
        return True

    def _woken(self) -> None:
        self._wake = None
        self._grant()

    def _grant(self) -> None:
        """Give free slots to waiting clients: the one holding fewest slots first, then the one whose turn came
        longest ago; a client at its bound, or whose next part is big while a big one runs, waits. Whoever is
        served goes to the back of the turns."""
        while self.free > 0:
            client = self._next()
            if client is _NOBODY:
                return
            queue = self._waiting[client]
            granted, big = queue.popleft()
            granted.set_result(None)
            self.free -= 1
            self.big += big
            self.held[client] += 1
            self._turns.remove(client)
            if queue:
                self._turns.append(client)
            else:
                del self._waiting[client]

    def _next(self):
        best, fewest = _NOBODY, None
        for client in list(self._turns):
            queue = self._waiting[client]
            while queue and queue[0][0].done():            # cancelled while waiting: not a waiter any more
                queue.popleft()
            if not queue:
                self._drop(client)
                continue
            if self._may_hold(client, queue[0][1]) and (fewest is None or self.held[client] < fewest):
                best, fewest = client, self.held[client]
        return best

    def _forget(self, client: str | None, granted: asyncio.Future) -> None:
        queue = self._waiting.get(client)
        entry = next((e for e in queue or () if e[0] is granted), None)
        if entry is not None:
            queue.remove(entry)
            if not queue:
                self._drop(client)

    def _drop(self, client: str | None) -> None:
        del self._waiting[client]
        self._turns.remove(client)

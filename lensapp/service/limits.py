"""Fair use per client: what one address may ask for, by count and by cost, so one script cannot take a public
Space for itself.

Each address (an IPv6 one by its /56: `identity.bucket`) has two token buckets:
- requests: `per_minute` a minute on average, in bursts of up to a fifth of that (at least 5). A large answer
  counts as more than one (`charge`): each ANSWER_BYTES of it one more. A visitor replaying the heaviest request
  the app accepts is answered from the result cache, but sending its 26 MB still costs the web process ~0.2 CPU
  seconds; at 60 a minute that was a fifth of a core for one visitor (bench/RESULTS.md, run AD).
- work: `work_per_minute` units of the cost model (`cost.py`) a minute, in bursts of `work_burst`. Work the
  engine really does for a request is spent from it when it starts (`spend`, through `paying`: a result the
  cache answers costs nothing), after the fact: the bucket may go below zero, and the address's next request
  waits until it is above. So twenty distinct heavy requests meet this limit long before the count's.
An IPv6 /48 (`identity.site`) has buckets of its own, SITE_SHARE times a client's, which every /56 in it also
draws from: a site that takes a fresh /56 for each request is limited as a few clients are.

A loopback IP is never limited: only a process on this machine has one (the host's own scripts, the tests,
the bench), and behind trusted proxies the derived address is loopback only when the outermost proxy itself
saw one; a name ("localhost") is nobody's address and exempts nothing. A workshop behind one address (a
university's NAT) should raise the limits or turn them off (`LENSAPP_RATE_LIMIT=0`, `LENSAPP_WORK_PER_MINUTE=0`).

At most `max_clients` buckets are kept. Only a full bucket is forgotten (it says nothing a new one would not):
a penalised address stays penalised however many others come by, and while every bucket kept is still in
use, newcomers share one overflow bucket.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator

from .field import RequestError
from .identity import bucket, is_loopback, site

ANSWER_BYTES = 4 << 20          # each this many bytes of one answer count as one more request
SITE_SHARE = 4                  # an IPv6 /48 may ask for this many clients' worth, all its /56s together
OVERFLOW = "overflow"           # the bucket newcomers share while every bucket kept is in use
SWEEP_SECONDS = 1.0             # the longest a full table goes unswept

_PAYER: contextvars.ContextVar[Callable[[int], None] | None] = contextvars.ContextVar("payer", default=None)


class RateLimited(RequestError):
    """Too many requests, or too much work, from one address."""


@contextlib.contextmanager
def paying(payer: Callable[[int], None] | None) -> Iterator[None]:
    """Within this block (this thread), the engine's work is spent by `payer(units)` (None: nobody's)."""
    token = _PAYER.set(payer)
    try:
        yield
    finally:
        _PAYER.reset(token)


def spend(units: int) -> None:
    """Work of `units` (cost.py's) starts now for whoever is paying (`paying`); nobody pays for the app's own."""
    payer = _PAYER.get()
    if payer is not None and units > 0:
        payer(units)


@dataclass(frozen=True)
class Rate:
    """A bucket's refill per second and its capacity."""

    per_second: float
    capacity: float

    def refill(self, tokens: float, seconds: float) -> float:
        return min(self.capacity, tokens + seconds * self.per_second)

    def wait(self, tokens: float, need: float) -> float:
        """Seconds until `tokens` reach `need`."""
        return max(0.0, need - tokens) / self.per_second if self.per_second > 0 else float("inf")


class RateLimiter:
    def __init__(self, per_minute: int, burst: int | None = None, clock=time.monotonic, max_clients: int = 10_000,
                 work_per_minute: int = 0, work_burst: int | None = None):
        self.requests = Rate(per_minute / 60.0, float(burst if burst is not None else max(5, per_minute // 5)))
        self.work = Rate(work_per_minute / 60.0, float(work_burst if work_burst is not None else work_per_minute))
        self.clock, self.max_clients = clock, max_clients
        self._buckets: dict[str, list[float]] = {}     # key -> [requests left, work left, last refill]
        self._lock = threading.Lock()
        self._swept = float("-inf")
        self.refused = 0

    @classmethod
    def of(cls, cfg) -> RateLimiter:
        """The limits a `config.Config` sets: `rate_limit` requests and `work_per_minute` units a minute, work in
        bursts of twice the heaviest request (`max_work`)."""
        return cls(cfg.rate_limit, work_per_minute=cfg.work_per_minute, work_burst=2 * cfg.max_work)

    def check(self, client: str | None) -> None:
        """Take one request for `client` (an IP address; anything else shares one bucket; None: a call from inside
        the app, never limited), or raise RateLimited saying when to come back: when its requests are spent, or
        when the work it asked for has run its work bucket below zero."""
        if not (self._limits(client, self.requests) or self._limits(client, self.work)):
            return
        with self._lock:
            buckets = self._refilled(client)
            busy = max((self.requests.wait(b[0], 1.0) for b, _ in buckets), default=0.0) \
                if self.requests.per_second > 0 else 0.0
            heavy = max((self.work.wait(b[1], 0.0) for b, _ in buckets), default=0.0) \
                if self.work.per_second > 0 else 0.0
            if busy > 0 or heavy > 0:
                self.refused += 1
                what = "too much work from your address for now" if heavy > busy else \
                    "too many requests from your address"
                raise RateLimited(f"{what}; try again in {max(1.0, busy, heavy):.0f} s")
            for b, _ in buckets:
                b[0] -= 1.0

    def allows(self, client: str | None) -> bool:
        """Whether `client` may ask now (what `check` would let through), taking nothing."""
        if not (self._limits(client, self.requests) or self._limits(client, self.work)):
            return True
        with self._lock:
            buckets = self._refilled(client)
            return all((self.requests.per_second == 0 or b[0] >= 1.0) and (self.work.per_second == 0 or b[1] >= 0)
                       for b, _ in buckets)

    def spend(self, client: str | None, units: float) -> None:
        """Count `units` of engine work against `client` as it starts. The bucket may go below zero, at most a
        burst below: the next request waits."""
        if units <= 0 or not self._limits(client, self.work):
            return
        with self._lock:
            for b, share in self._refilled(client):
                b[1] = max(b[1] - units, -self.work.capacity * share)

    def charge(self, client: str | None, answer_bytes: int) -> None:
        """Count an answer of `answer_bytes` against `client` once it is made (one more request for each
        ANSWER_BYTES of it). The bucket may go below zero, at most a burst below: the next request waits."""
        extra = answer_bytes / ANSWER_BYTES
        if extra <= 0 or not self._limits(client, self.requests):
            return
        with self._lock:
            for b, share in self._refilled(client):
                b[0] = max(b[0] - extra, -self.requests.capacity * share)

    def _limits(self, client: str | None, rate: Rate) -> bool:
        return rate.per_second > 0 and client is not None and not is_loopback(client)

    def _refilled(self, client: str) -> list[tuple[list[float], int]]:
        """The buckets `client` draws from, refilled to now, each with its share (a site's is SITE_SHARE), the
        lock held."""
        now = self.clock()
        keys = [(bucket(client), 1)]
        if site(client) is not None:
            keys.append((f"site {site(client)}", SITE_SHARE))
        out = []
        for key, share in keys:
            b = self._buckets.get(key)
            if b is None:
                key = key if self._room(now) else OVERFLOW
                b = self._buckets.setdefault(key, [self.requests.capacity * share, self.work.capacity * share, now])
            b[0] = min(self.requests.capacity * share, b[0] + (now - b[2]) * self.requests.per_second * share)
            b[1] = min(self.work.capacity * share, b[1] + (now - b[2]) * self.work.per_second * share)
            b[2] = now
            out.append((b, share))
        return out

    def _room(self, now: float) -> bool:
        """Whether a new bucket may be kept: below `max_clients`, or once full buckets are forgotten (at most one
        sweep a SWEEP_SECONDS: a table of buckets all in use stays as it is, newcomers share OVERFLOW)."""
        if len(self._buckets) < self.max_clients:
            return True
        if now - self._swept >= SWEEP_SECONDS:
            self._swept = now
            for key in [k for k, b in self._buckets.items() if k != OVERFLOW and self._full(k, b, now)]:
                del self._buckets[key]
        return len(self._buckets) < self.max_clients

    def _full(self, key: str, b: list[float], now: float) -> bool:
        share = SITE_SHARE if key.startswith("site ") else 1
        elapsed = now - b[2]
        return (self.requests.refill(b[0] / share, elapsed) >= self.requests.capacity
                and (self.work.per_second == 0 or self.work.refill(b[1] / share, elapsed) >= self.work.capacity))

"""Fair use per client: what one address may ask for, by count and by cost, so one script cannot take a public
Space for itself.

Each address (an IPv6 one by its /56: `identity.bucket`) has two token buckets (`Bucket`):
- requests: `per_minute` a minute on average, in bursts of up to a fifth of that (at least 5). A large answer
  counts as more than one (`charge`): each ANSWER_BYTES of it one more. A visitor replaying the heaviest request
  the app accepts is answered from the result cache, but sending its 26 MB still costs the web process ~0.2 CPU
  seconds; at 60 a minute that was a fifth of a core for one visitor (bench/RESULTS.md, run AD).
- work: `work_per_minute` units of the cost model (`cost.py`) a minute, in bursts of `work_burst`. A request's
  planned cost is taken whole when its engine work starts (`spend`, as the request's payer: `asks.Ask.pay`; a
  result the cache answers costs nothing), or the request is refused then, saying when there will be enough. A
  visitor pays for what ran: work the engine then refuses (busy, over the asker's share, down, restarted) is given
  back whole, and a stream stopped early keeps only the steps it made (`asks.Ask.paying`), each to the buckets it
  was taken from (`spend` says how), so a visitor who presses again after "busy" finds the budget as it was. Work
  in flight is taken before more is let in, so requests running at once share one budget: four at once cannot
  spend twice it a minute (they did while work was spent after the fact, from any bucket at or above zero). So
  twenty distinct heavy requests meet this limit long before the count's.
An IPv6 /48 (`identity.site`) has buckets of its own, SITE_SHARE times a client's, which every /56 in it also
draws from: a site that takes a fresh /56 for each request is limited as a few clients are.

A person told apart behind an address (`identity.People`: a browser that loaded the page, by its visitor cookie,
and a login) has buckets of their own, as large as an address's, from their first request. A room of thirty behind
one NAT address asks as thirty visitors do, and the address's own buckets are what everything else behind it shares
(an API call, gradio_client, a script, however many sessions it holds). So what an address may ask grows by one
visitor's worth with each person seated behind it, up to `identity.ROOM_PEOPLE`; a script can multiply it only by
loading the page for cookies as browsers do, no more than that many at once, and a fresh budget only as often as
the address is given a new cookie (`identity.NEW_VISITORS`).

A loopback IP is never limited: only a process on this machine has one (the host's own scripts, the tests,
the bench), and behind trusted proxies the derived address is loopback only when the outermost proxy itself
saw one; a name ("localhost") is nobody's address and exempts nothing.

At most `max_clients` buckets are kept. Only a full bucket is forgotten (it says nothing a new one would not):
a penalised address stays penalised however many others come by, and while every bucket kept is still in
use, newcomers share one overflow bucket.

Why our own `Bucket` and not the `limits` package (5.8): it charges a cost per hit, but only in windows (a fixed
window lets twice the limit through across its edge; a moving window keeps one timestamp per unit, 24,000 for one
heavy request; a sliding counter approximates), reads `time.time()` itself (no stopped clock for the tests), cannot
take from an address's and its site's buckets at once, nor count an answer after the fact below zero, and keeps
any number of keys. What is needed here is a dozen lines of arithmetic, tested in tests/test_guard.py and
tests/test_budgets.py.
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Callable, NamedTuple

from .buckets import Bucket, Rate
from .field import RequestError
from .identity import Asker, bucket, is_loopback, site, turn

ANSWER_BYTES = 4 << 20          # each this many bytes of one answer count as one more request
SITE_SHARE = 4                  # an IPv6 /48 may ask for this many clients' worth, all its /56s together
OVERFLOW = "overflow"           # the bucket newcomers share while every bucket kept is in use
SWEEP_SECONDS = 1.0             # the longest a full table goes unswept


class RateLimited(RequestError):
    """Too many requests, or too much work, from one address."""


class Account(NamedTuple):
    """One address's (or one site's) buckets."""

    requests: Bucket
    work: Bucket


class RateLimiter:
    def __init__(self, per_minute: int, burst: int | None = None, clock=time.monotonic, max_clients: int = 10_000,
                 work_per_minute: int = 0, work_burst: int | None = None):
        self.requests = Rate(per_minute / 60.0, float(burst if burst is not None else max(5, per_minute // 5)))
        self.work = Rate(work_per_minute / 60.0, float(work_burst if work_burst is not None else work_per_minute))
        self.clock, self.max_clients = clock, max_clients
        self._buckets: dict[str, Account] = {}
        self._lock = threading.Lock()
        self._swept = float("-inf")
        self.refused = 0

    @classmethod
    def of(cls, limits) -> RateLimiter:
        """The limits `limits` (`config.LimitSettings`) sets: `rate_limit` requests and `work_per_minute` units a
        minute, work in bursts of twice the heaviest request (`max_work`)."""
        return cls(limits.rate_limit, work_per_minute=limits.work_per_minute, work_burst=2 * limits.max_work)

    def check(self, client: Asker | str | None) -> None:
        """Take one request for `client` (an IP address, or an `identity.Asker`: a person behind one; anything
        else shares one bucket; None: a call from inside the app, never limited), or raise RateLimited saying when
        to come back: when its requests are spent, or while work it was let run (dearer than a whole burst) keeps
        its work bucket below zero."""
        asker = _asker(client)
        if not (self._limits(asker, self.requests) or self._limits(asker, self.work)):
            return
        with self._lock:
            asking, working = self._refilled(asker, own=asker.person is not None), self._working(asker)
            busy = max(a.requests.wait(1.0) for a in asking) if self._limits(asker, self.requests) else 0.0
            heavy = max(a.work.wait(0.0) for a in working) if self._limits(asker, self.work) else 0.0
            if busy > 0 or heavy > 0:
                self._refuse(f"too much work from {_you(asker)} for now" if heavy > busy else
                             f"too many requests from {_you(asker)}", max(busy, heavy))
            for a in asking:
                a.requests.take(1.0)

    def spend(self, client: Asker | str | None, units: float) -> Callable[[float], None] | None:
        """Take `units` of engine work for `client` as the work starts, or raise RateLimited saying when its budget
        will hold them: what is running already has been taken. Work dearer than a whole burst (a fit may be)
        goes from a full bucket and leaves it at most a burst below zero. Returns how to give some back
        (`give_back(n)`: n of these units, to the very buckets they came from), or None when nothing was taken."""
        asker = _asker(client)
        if units <= 0 or not self._limits(asker, self.work):
            return None
        with self._lock:
            working = self._working(asker)
            wait = max(a.work.wait(min(units, a.work.capacity)) for a in working)
            if wait > 0:
                self._refuse(f"too much work from {_you(asker)} for now", wait)
            taken = [(a.work, a.work.take(units)) for a in working]
        return functools.partial(self._give_back, taken, units)

    def _give_back(self, taken: list[tuple[Bucket, float]], units: float, n: float) -> None:
        """`n` of `units` spent given back to each bucket they were taken from, in proportion to what it gave (a
        bucket left at a burst below zero gave less than all). A bucket forgotten since was full: nothing owed."""
        share = min(max(n, 0.0), units) / units
        with self._lock:
            now = self.clock()
            for work, amount in taken:
                work.refill(now)
                work.give(amount * share)

    def charge(self, client: Asker | str | None, answer_bytes: int) -> None:
        """Count an answer of `answer_bytes` against `client` once it is made (one more request for each
        ANSWER_BYTES of it). The bucket may go below zero, at most a burst below: the next request waits."""
        asker = _asker(client)
        extra = answer_bytes / ANSWER_BYTES
        if extra <= 0 or not self._limits(asker, self.requests):
            return
        with self._lock:
            for a in self._refilled(asker, own=asker.person is not None):
                a.requests.take(extra)

    def _refuse(self, what: str, wait: float) -> None:
        self.refused += 1
        raise RateLimited(f"{what}; try again in {max(1.0, wait):.0f} s")

    def _limits(self, asker: Asker, rate: Rate) -> bool:
        return rate.per_second > 0 and asker.address is not None and not is_loopback(asker.address)

    def _working(self, asker: Asker) -> list[Account]:
        """The accounts `asker`'s engine work comes from: a person's own, else the address's."""
        return self._refilled(asker, own=asker.person is not None)

    def _refilled(self, asker: Asker, own: bool) -> list[Account]:
        """The accounts `asker` draws from, refilled to now, the lock held: the person's own (`own`), or the
        address's and its site's (SITE_SHARE times as large)."""
        now, client = self.clock(), asker.address
        if own:
            keys = [(person_key(client, asker.person), 1)]
        else:
            keys = [(bucket(client), 1)]
            if site(client) is not None:
                keys.append((f"site {site(client)}", SITE_SHARE))
        out = []
        for key, share in keys:
            account = self._buckets.get(key)
            if account is None:
                key = key if self._room(now) else OVERFLOW
                account = self._buckets.setdefault(key, Account(Bucket(self.requests, share, now),
                                                                Bucket(self.work, share, now)))
            account.requests.refill(now)
            account.work.refill(now)
            out.append(account)
        return out

    def _room(self, now: float) -> bool:
        """Whether a new bucket may be kept: below `max_clients`, or once full buckets are forgotten (at most one
        sweep a SWEEP_SECONDS: a table of buckets all in use stays as it is, newcomers share OVERFLOW)."""
        if len(self._buckets) < self.max_clients:
            return True
        if now - self._swept >= SWEEP_SECONDS:
            self._swept = now
            for key in [k for k, a in self._buckets.items() if k != OVERFLOW and a.requests.full(now)
                        and a.work.full(now)]:
                del self._buckets[key]
        return len(self._buckets) < self.max_clients


def person_key(client: str | None, person: str) -> str:
    """Whose buckets and engine turn a person behind `client` has: theirs alone, never an address's or a site's."""
    return f"{turn(client)} {person}"


def _asker(client: Asker | str | None) -> Asker:
    return client if isinstance(client, Asker) else Asker(client)


def _you(asker: Asker) -> str:
    """Whose limit it is: the person's own, or the address's, which everything behind it not told apart shares."""
    return "you" if asker.person is not None else "your address"

"""Fair use per client: a token bucket per address, so one script cannot take a public Space for itself.

Each address (an IPv6 one by its /64: `identity.bucket`) may make `per_minute` requests a minute
on average, in bursts of up to a fifth of that (at least 5). A loopback IP is never limited: only a
process on this machine has one (the host's own scripts, the tests, the bench), and behind trusted
proxies the derived address is loopback only when the outermost proxy itself saw one; a name
("localhost") is nobody's address and exempts nothing. A workshop behind one address (a
university's NAT) should raise the limit or turn it off (`LENSAPP_RATE_LIMIT=0`).

A large answer counts as more than one request (`charge`): each ANSWER_BYTES of it one more. A visitor replaying
the heaviest request the app accepts is answered from the result cache, but sending its 26 MB still costs the web
process ~0.2 CPU seconds; at 60 a minute that was a fifth of a core for one visitor (bench/RESULTS.md, run AD).
"""

from __future__ import annotations

import threading
import time

from .field import RequestError
from .identity import bucket, is_loopback

ANSWER_BYTES = 4 << 20          # each this many bytes of one answer count as one more request


class RateLimited(RequestError):
    """Too many requests from one address."""


class RateLimiter:
    def __init__(self, per_minute: int, burst: int | None = None, clock=time.monotonic, max_clients: int = 10_000):
        self.rate = per_minute / 60.0
        self.burst = float(burst if burst is not None else max(5, per_minute // 5))
        self.clock, self.max_clients = clock, max_clients
        self._buckets: dict[str, tuple[float, float]] = {}     # address -> (tokens, last refill)
        self._lock = threading.Lock()
        self.refused = 0

    def check(self, client: str | None) -> None:
        """Take one token for `client` (an IP address; anything else shares one bucket; None: a call from
        inside the app, never limited), or raise RateLimited saying when to come back."""
        if not self._limits(client):
            return
        with self._lock:
            key, tokens, now = self._refilled(client)
            if tokens < 1.0:
                self._buckets[key] = (tokens, now)
                self.refused += 1
                wait = (1.0 - tokens) / self.rate
                raise RateLimited(f"too many requests from your address; try again in {wait:.0f} s")
            self._buckets[key] = (tokens - 1.0, now)
            if len(self._buckets) > self.max_clients:        # forget the longest-idle addresses
                for old, _ in sorted(self._buckets.items(), key=lambda kv: kv[1][1])[:self.max_clients // 10]:
                    del self._buckets[old]

    def charge(self, client: str | None, answer_bytes: int) -> None:
        """Count an answer of `answer_bytes` against `client` once it is made (one more request for each
        ANSWER_BYTES of it). The bucket may go below zero, at most a burst below: the next request waits."""
        extra = answer_bytes / ANSWER_BYTES
        if not self._limits(client) or extra <= 0:
            return
        with self._lock:
            key, tokens, now = self._refilled(client)
            self._buckets[key] = (max(tokens - extra, -self.burst), now)

    def _limits(self, client: str | None) -> bool:
        return self.rate > 0 and client is not None and not is_loopback(client)

    def _refilled(self, client: str) -> tuple[str, float, float]:
        """(client's bucket, its tokens now, now), the lock held."""
        key, now = bucket(client), self.clock()
        tokens, last = self._buckets.get(key, (self.burst, now))
        return key, min(self.burst, tokens + (now - last) * self.rate), now

"""A token bucket, the one shape of "so much at once, then so much a second": the rate limit's requests and work
(`limits.py`) and the visitor cookies an address is given (`identity.py`) are each one."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rate:
    """A bucket's refill per second and its capacity."""

    per_second: float
    capacity: float


class Bucket:
    """A token bucket: up to `capacity` tokens, refilled at `per_second`. What is taken may leave it below zero, at
    most a burst below (an answer counted after the fact, a request dearer than a whole burst): it refills from
    there."""

    __slots__ = ("per_second", "capacity", "tokens", "at")

    def __init__(self, rate: Rate, share: int, now: float):
        self.per_second, self.capacity = rate.per_second * share, rate.capacity * share
        self.tokens, self.at = self.capacity, now

    def refill(self, now: float) -> None:
        self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.per_second)
        self.at = now

    def wait(self, need: float) -> float:
        """Seconds until it holds `need` (refilled to now)."""
        if self.tokens >= need:
            return 0.0
        return (need - self.tokens) / self.per_second if self.per_second > 0 else float("inf")

    def take(self, n: float) -> float:
        """Take `n` (at most down to a burst below zero): what was taken."""
        before = self.tokens
        self.tokens = max(self.tokens - n, -self.capacity)
        return before - self.tokens

    def give(self, n: float) -> None:
        """Give back `n` taken before (never past its capacity)."""
        self.tokens = min(self.capacity, self.tokens + n)

    def full(self, now: float) -> bool:
        return self.tokens + (now - self.at) * self.per_second >= self.capacity

"""What every speed bench here times the same way: one untimed round (compiles, warms the caches), then the
median of `repeats` rounds."""

from __future__ import annotations

import statistics
import time


def median_time(fn, repeats: int) -> float:
    fn()                                                    # untimed: compiles, warms the caches
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)

"""Giving the web process's freed memory back to the system.

Answering a visitor builds large transient objects (a long all-layer lens at k=100 is a 26 MB answer, its chart's
spec and tables as much again), freed once sent. glibc's allocator keeps what was freed in its heaps for reuse,
spread over one arena per thread, and returns little of it: twenty-four visitors who each opened a distinct such
link grew the web process by 738 MB, of which `malloc_trim(0)` handed 613 MB back at once (bench/RESULTS.md). What
the app holds on purpose is bounded elsewhere (the result cache, the pages' kept results, the sessions); this is the
rest. `Trimmer` is a daemon thread that trims when the process has grown by `GROWTH` since it last did, looking
every `SECONDS` (a trim takes a few milliseconds per GB of heap), and also when the process has settled (it did not
move between two looks) having grown by more than `SETTLED`: a quiet app gives back all it freed, not all but the
last `GROWTH`. The app starts it as it serves and stops it as it closes (`server.running`).

`map_large_blocks` keeps the largest of those objects out of the heaps altogether: glibc maps a block of
`LARGE` or more on its own and unmaps it when freed, but by default raises that threshold to the size of any
such block freed (up to 32 MB), after which every answer's megabytes are carved from the heaps, where what is
left between them stays until a trim finds whole free pages. A fixed threshold ends that, and two arenas bound
the heaps the web process's many threads spread over. 4 MB, not less: a model run in this process (the
transformers backend) makes and frees 1-4 MB tensors at every layer, and mapping those cost its forward ~10%.
Not glibc (musl, macOS): both do nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import threading
import time

log = logging.getLogger(__name__)

SECONDS = 10.0
GROWTH = 64 << 20
SETTLED = 4 << 20
LARGE = 4 << 20          # a block this large or larger has its own mapping, returned to the system when freed
ARENAS = 2
_M_MMAP_THRESHOLD, _M_ARENA_MAX = -3, -8          # glibc's mallopt parameters (malloc.h)


def _libc():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def resident_bytes() -> int:
    """This process's resident memory, from /proc (0 where there is none)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_LIBC = _libc()


def map_large_blocks(large: int = LARGE, arenas: int = ARENAS) -> bool:
    """Allocate every block of `large` bytes or more as its own mapping, and use at most `arenas` heaps; whether
    the allocator took both."""
    if _LIBC is None:
        return False
    return bool(_LIBC.mallopt(_M_MMAP_THRESHOLD, large)) and bool(_LIBC.mallopt(_M_ARENA_MAX, arenas))


def trim() -> int:
    """Return freed heap memory to the system now; the bytes the process shrank by (0 where it cannot)."""
    if _LIBC is None:
        return 0
    before = resident_bytes()
    _LIBC.malloc_trim(0)
    return max(0, before - resident_bytes())


class Trimmer:
    """Trim whenever the process has grown by `growth` bytes since the last trim, or by `settled` bytes and then
    stayed put between two looks, looking every `seconds`."""

    def __init__(self, seconds: float = SECONDS, growth: int = GROWTH, settled: int = SETTLED):
        self.seconds, self.growth, self.settled = seconds, growth, settled
        self.trims, self.returned = 0, 0
        self._floor = self._last = resident_bytes()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Trimmer:
        if _LIBC is not None and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="lens-heap-trim", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """End the thread and wait for it (a trim under way takes milliseconds)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def look(self) -> None:
        """Trim if the process has grown enough since the last trim, or grown a little and settled (what the
        thread does every `seconds`)."""
        now = resident_bytes()
        grown, settled = now - self._floor, abs(now - self._last) < self.settled
        self._last = now
        if grown < self.growth and not (settled and grown >= self.settled):
            return
        t = time.perf_counter()
        freed = trim()
        self.trims, self.returned = self.trims + 1, self.returned + freed
        self._floor = self._last = resident_bytes()
        log.info("gave %d MB of freed memory back to the system in %.0f ms", freed >> 20,
                 (time.perf_counter() - t) * 1000)

    def _run(self) -> None:
        while not self._stop.wait(self.seconds):
            try:
                self.look()
            except Exception:  # noqa: BLE001 - a failed trim must not end the thread; the next look may pass
                log.exception("trimming the heap failed")

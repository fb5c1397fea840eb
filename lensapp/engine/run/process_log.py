"""The last lines this process and its children printed, kept so that an engine failure has a named cause.

vLLM runs its engine in child processes (EngineCore, and its workers). When one of them fails to start,
the parent hears only "Engine core initialization failed. See root cause above"; the cause is in what
the child printed. `capture()` tees this process's stderr (file descriptor 2, which the children
inherit) through a pipe: everything still reaches the terminal or the log file, and the last lines are
kept here, where `cause()` finds the last error in them. It is started once, before vLLM's processes,
and runs as long as the process does (the children hold the pipe).
"""

from __future__ import annotations

import collections
import os
import re
import threading

KEEP = 2000
# vLLM prefixes its children's lines with "(EngineCore pid=123) " or "(Worker pid=45) ", its log lines
# with "ERROR 12-01 05:21:42 [core.py:1510] ", and a distributed rank's with "[rank0]: " (repeated).
_PREFIX = re.compile(r"^(\([\w .:-]+ pid=\d+\)\s*)?(\[rank\d+\]:\s*)*"
                     r"((DEBUG|INFO|WARNING|ERROR|CRITICAL) \S+ \S+ \[[^\]]*\]\s*)?")
_ERROR = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)): (.+)$")
# What the parent (or EngineCore, for its worker) says when a child failed: the cause is elsewhere.
_WRAPPERS = ("Engine core initialization failed", "WorkerProc initialization failed", "EngineCore encountered",
             "WorkerProc hit an exception", "Worker failed with error", "See stack trace", "See root cause")


class ProcessLog:
    def __init__(self, keep: int = KEEP):
        self._lines: collections.deque[str] = collections.deque(maxlen=keep)
        self._count = 0
        self._lock = threading.Lock()
        self._started = False

    def capture(self) -> None:
        """Tee fd 2 into this log (once per process; later calls do nothing)."""
        with self._lock:
            if self._started:
                return
            self._started = True
        read_end, write_end = os.pipe()
        original = os.dup(2)
        os.dup2(write_end, 2)
        os.close(write_end)
        threading.Thread(target=self._pump, args=(read_end, original), name="lens-stderr", daemon=True).start()

    def feed(self, text: str) -> None:
        with self._lock:
            for line in text.splitlines():
                self._lines.append(line)
                self._count += 1

    def mark(self) -> int:
        """Lines seen so far: `cause(since=mark())` then looks only at what comes after."""
        return self._count

    def cause(self, since: int = 0) -> str | None:
        """The last error printed since `since` ("ValueError: ..."), prefixes stripped; None if none."""
        with self._lock:
            recent = list(self._lines)[-max(0, self._count - since):] if self._count > since else []
        for line in reversed(recent):
            text = _PREFIX.sub("", line).strip()
            match = _ERROR.match(text)
            if match and not any(w in text for w in _WRAPPERS):
                return text
        return None

    def _pump(self, read_end: int, original: int) -> None:
        partial = b""
        while True:
            try:
                chunk = os.read(read_end, 65536)
            except OSError:
                return
            if not chunk:
                return
            _write_all(original, chunk)
            *whole, partial = (partial + chunk).split(b"\n")
            partial = partial[-65536:]       # a line that never ends (a progress bar's \r) is kept short
            if whole:
                self.feed(b"\n".join(whole).decode("utf-8", "replace"))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except OSError:              # the terminal went away, or a test's capture file was closed
            return


LOG = ProcessLog()

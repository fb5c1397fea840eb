"""`make test`'s runner: the suite in two pytest processes side by side, the engine tests in one, the rest in the other.

The suite spends most of its time waiting (engines starting, browsers drawing, requests in flight): run one after
the other, it kept the machine's two cores 42% busy. The `engine` tests (marked in conftest.py: the session's vLLM
engine and app, and the tests that start engine services of their own) stay in one process, in their order, so
the shared engine and app are started once and the `disruptive` ones still run last; every other test runs in the
second process at the same time. Each lane has its own temporary folder (pytest cleans old numbered folders in
the shared one). The rest's output streams as it comes; the engine lane's is printed when it ends. The exit code is
the first failing lane's, else 0 (a lane that selects no test is not a failure).

pytest-xdist's `loadgroup` was the library's way to do this, but with pytest 9.2 it did not keep a group on one
worker (xdist 3.8 renames the items' node ids, which pytest 9 no longer reads: tried, every test spread over both
workers, each starting its own engine and app), so this runs two plain pytest processes.

    python tests/two_lanes.py -m "not extended" [pytest's arguments...]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent
NO_TESTS = 5        # pytest's exit when a lane selects nothing (a -k that names only the other lane's tests)


def lane_marker(marker: str, engine: bool) -> str:
    lane = "engine" if engine else "not engine"
    return f"({marker}) and {lane}" if marker else lane


def start(marker: str, engine: bool, more: list[str], out) -> subprocess.Popen:
    basetemp = tempfile.mkdtemp(prefix=f"lens-tests-{'engine' if engine else 'rest'}-")
    return subprocess.Popen([sys.executable, "-m", "pytest", "-m", lane_marker(marker, engine),
                             f"--basetemp={basetemp}", *more, str(TESTS)],
                            stdout=out, stderr=subprocess.STDOUT, cwd=TESTS.parent)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", dest="marker", default="", help="pytest's marker expression, for both lanes")
    args, more = parser.parse_known_args(argv)
    t0 = time.monotonic()
    with tempfile.TemporaryFile("w+") as engine_log:
        engine = start(args.marker, True, more, engine_log)
        rest = start(args.marker, False, more, None)           # to this terminal, as it comes
        ends: dict[str, float] = {}
        waits = [threading.Thread(target=lambda p=p, n=n: (p.wait(), ends.__setitem__(n, time.monotonic() - t0)))
                 for n, p in (("engine", engine), ("rest", rest))]
        for w in waits:
            w.start()
        for w in waits:
            w.join()
        engine_log.seek(0)
        print("\n======== the engine lane ========", flush=True)
        sys.stdout.write(engine_log.read())
    print(f"\nlanes: the rest {ends['rest'] / 60:.1f} min (exit {rest.returncode}), the engine tests "
          f"{ends['engine'] / 60:.1f} min (exit {engine.returncode})", flush=True)
    return next((code for code in (rest.returncode, engine.returncode) if code not in (0, NO_TESTS)), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

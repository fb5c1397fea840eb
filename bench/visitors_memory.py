"""What visitors leave behind: the web process's memory after N visitors each open a distinct long link and leave.

Starts `lensapp serve` from a checkout (this one, or an older one with --repo, to measure before and after),
then N visits in headless Chromium, `--at-once` pages at a time: each page opens the next visitor's link to a
distinct all-layer logit lens (`--words` words, top-`--k`), waits for its heatmap, and goes on to the next link,
which leaves the previous session (its socket closes). Prints the web process's resident memory (RSS, the
`lensapp serve` process; the engine's processes are not counted) after every batch and after a pause at the
end, as JSON. Needs Debian's chromium and the Python playwright package (`make test` installs both).

    python bench/visitors_memory.py [--visits 200] [--at-once 6] [--words 30] [--k 10] [--repo /tmp/old]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import quote

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
WORDS = ("river city light stone garden winter music letter market window forest bridge summer paper island "
         "engine yellow quiet morning silver ocean history school family travel kitchen mountain story").split()
MiB = 1 << 20


def prompt(i: int, words: int) -> str:
    rng = random.Random(i)
    return f"Visitor {i} wrote: " + " ".join(rng.choice(WORDS) for _ in range(words))


def start(repo: Path, extra: list[str]) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(f"/tmp/visitors-memory-{port}.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "lensapp", "serve", "--port", str(port), *extra], cwd=repo,
                            stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONPATH": str(repo), "GRADIO_ANALYTICS_ENABLED": "False"})
    url = f"http://127.0.0.1:{port}/"
    deadline = time.time() + 900
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"error: the app exited with {proc.returncode} (log: {log.name})")
        try:
            with urllib.request.urlopen(url + "health", timeout=10) as r:
                if json.loads(r.read())["state"] == "ready":
                    return proc, url
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(2)
    raise SystemExit("error: the app was not ready in 15 minutes")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--visits", type=int, default=200)
    parser.add_argument("--at-once", type=int, default=6)
    parser.add_argument("--words", type=int, default=30)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--repo", type=Path, default=REPO, help="the checkout whose app is measured")
    parser.add_argument("--pause", type=float, default=15, help="seconds to wait after the last visit")
    args = parser.parse_args(argv)
    import psutil
    from playwright.sync_api import sync_playwright

    proc, url = start(args.repo, [])
    app = psutil.Process(proc.pid)
    out = {"repo": str(args.repo), "visits": args.visits, "words": args.words, "k": args.k, "rss_mb": []}
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            contexts = [browser.new_context(viewport={"width": 1400, "height": 1000}) for _ in range(args.at_once)]
            pages = [c.new_page() for c in contexts]

            def visit(first: int) -> None:
                for i, page in enumerate(pages, start=first):
                    page.goto(f"{url}?v=1&tab=logit&prompt={quote(prompt(i, args.words))}&layers=all&k={args.k}",
                              wait_until="commit", timeout=300_000)
                for page in pages:
                    page.wait_for_selector("#logit-heatmap svg.marks g.role-mark path", timeout=600_000)

            visit(10_000)                                   # warm: the page's and the engine's first costs
            out["start_mb"] = app.memory_info().rss / MiB
            t = time.perf_counter()
            for first in range(0, args.visits, args.at_once):
                visit(first)
                out["rss_mb"].append(round(app.memory_info().rss / MiB))
                print(f"after {first + args.at_once} visits: {out['rss_mb'][-1]} MB "
                      f"({time.perf_counter() - t:.0f} s)", file=sys.stderr, flush=True)
            out["seconds"] = round(time.perf_counter() - t)
            for c in contexts:
                c.close()
            browser.close()
        time.sleep(args.pause)
        out["end_mb"] = round(app.memory_info().rss / MiB)
        out["grown_mb"] = round(out["end_mb"] - out["start_mb"])
        out["start_mb"] = round(out["start_mb"])
    finally:
        proc.terminate()
        proc.wait(timeout=120)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

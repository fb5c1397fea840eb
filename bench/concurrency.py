"""A workshop's worth of people at once: N callers each asking for an all-layer lens.

Runs the same N requests one after another, then from N threads at once (the engine drains the
waiting requests into one forward, one invoke per prompt), and prints both wall times. With --url
the requests go through a running app's /lens endpoint (gradio_client, one client per user), as a
workshop's browsers would. The last line is one JSON object.

    python bench/concurrency.py [--users 8] [--layers all]
    python bench/concurrency.py --users 30 --url http://127.0.0.1:7860/
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lensapp import config  # noqa: E402

PROMPTS = ["The capital of France is", "Water boils at", "The Eiffel Tower is located in the city of",
           "La capitale de la France est", "12 + 7 =", "The opposite of hot is", "My favourite colour is",
           "The largest planet in the solar system is"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=8)
    parser.add_argument("--layers", default="all")
    parser.add_argument("--url", help="a running app to call through its /lens endpoint instead of an engine here")
    config.add_arguments(parser)
    args = parser.parse_args(argv)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.users)]
    if args.url:
        from gradio_client import Client

        clients = [Client(args.url, verbose=False) for _ in prompts]
        calls = [lambda c=c, p=p: c.predict(p, "logit", args.layers, 5, "", api_name="/lens")
                 for c, p in zip(clients, prompts)]
        close = lambda: None  # noqa: E731
    else:
        config.prepare_process_environment()
        from lensapp.engine import Engine, LensRequest

        engine = Engine.from_config(config.replace(config.from_args(args), jlens="none"))
        calls = [lambda p=p: engine.lens(LensRequest(prompts=(p,), layers=args.layers, k=5)) for p in prompts]
        close = engine.close
    try:
        calls[0]()                                             # a warm start for both timings
        t = time.perf_counter()
        for call in calls:
            call()
        sequential = time.perf_counter() - t
        latencies = []

        def timed(call):
            t0 = time.perf_counter()
            call()
            latencies.append(time.perf_counter() - t0)

        t = time.perf_counter()
        with ThreadPoolExecutor(args.users) as pool:
            list(pool.map(timed, calls))
        concurrent = time.perf_counter() - t
    finally:
        close()
    latencies.sort()
    where = f"through {args.url}" if args.url else "on an engine here"
    print(f"{args.users} users, layers {args.layers}, {where}: one after another {sequential:.2f} s, all at once "
          f"{concurrent:.2f} s ({sequential / concurrent:.2f}x throughput; median wait {latencies[len(latencies) // 2]:.2f} s)")
    print(json.dumps({"users": args.users, "via": args.url or "engine", "sequential_s": round(sequential, 3),
                      "concurrent_s": round(concurrent, 3), "speedup": round(sequential / concurrent, 3),
                      "median_latency_s": round(latencies[len(latencies) // 2], 3)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

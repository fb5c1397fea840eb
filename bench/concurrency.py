"""A workshop's worth of people at once: N callers each asking for an all-layer lens.

Runs the same N requests one after another, then from N threads at once (the engine drains the
waiting requests into one forward, one invoke per prompt), and prints both wall times. The last line
is one JSON object.

    python bench/concurrency.py [--users 8] [--layers all]
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
    config.add_arguments(parser)
    args = parser.parse_args(argv)
    config.prepare_process_environment()
    from lensapp.engine import Engine, LensRequest

    engine = Engine.from_config(config.replace(config.from_args(args), jlens="none"))
    requests = [LensRequest(prompts=(PROMPTS[i % len(PROMPTS)],), layers=args.layers, k=5) for i in range(args.users)]
    try:
        t = time.perf_counter()
        for r in requests:
            engine.lens(r)
        sequential = time.perf_counter() - t
        t = time.perf_counter()
        with ThreadPoolExecutor(args.users) as pool:
            list(pool.map(engine.lens, requests))
        concurrent = time.perf_counter() - t
    finally:
        engine.close()
    print(f"{args.users} users, layers {args.layers}: one after another {sequential:.2f} s, "
          f"all at once {concurrent:.2f} s ({sequential / concurrent:.2f}x throughput)")
    print(json.dumps({"users": args.users, "sequential_s": round(sequential, 3), "concurrent_s": round(concurrent, 3),
                      "speedup": round(sequential / concurrent, 3)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What the road not taken costs: a branch against generating its continuation alone, and a Patchscopes layer
sweep against one request per layer.

On the service (the embedded model on vLLM by default), after one untimed round of each:
  branch          a generation branched at step --step (its trunk already computed and cached, as on the page:
                  only the continuation runs, reading the forced token's position and the new tokens)
  alone           the same continuation generated from prefix + forced token as a plain generation (the prefix's
                  every position read again)
  sweep           one describe request over every layer of one position (the prompt read once, then one
                  generation per layer as the parts of one request, in flight together)
  sequential      the same descriptions as one request per layer, one after another
Each timed round forces a token not forced before (so no branch is served from the cache); descriptions run
past the cache. Goals: branch < alone; sweep < sequential. Medians of --repeats; the last line is one JSON object.

    python bench/road_speed.py [--repeats 3] [--tokens 16] [--step 4]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lensapp import config  # noqa: E402

PROMPT = ("The old lighthouse keeper climbed the stairs every evening to light the lamp, and the ships that "
          "passed the rocks at night knew that")
DESCRIBED = "The Eiffel Tower is in the city of"


def median_time(fn, repeats: int) -> float:
    fn(-1)                                                   # untimed: compiles, warms the caches
    times = []
    for i in range(repeats):
        t = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=16, help="the generation's tokens")
    parser.add_argument("--step", type=int, default=4, help="the step forced")
    parser.add_argument("--describe-tokens", type=int, default=8)
    args = parser.parse_args(argv)
    config.prepare_process_environment()

    from lensapp.engine.run.protocol import Sampling
    from lensapp.service import DescribeRequest, GenerateRequest, LensService

    # A long deadline: the bench measures a busy machine's time, it does not cut it short.
    service = LensService.start(config.Config.of(jlens="none", request_timeout=1800))
    service.wait_ready(900)
    try:
        info = service.info
        req = GenerateRequest(prompt=PROMPT, max_tokens=args.tokens, k=5)
        trunk = service.generate(req)                                 # cached: what the page has already
        ids = service.prompts.ids(PROMPT)
        candidates = [t for t in range(1000, 1000 + 8 * (args.repeats + 1)) if t != trunk.token_ids[args.step]]
        n_new = args.tokens - args.step - 1

        def branch(i):
            return service.generate(dataclasses.replace(req, force=((args.step, candidates[i + 1]),)))

        def alone(i):
            prefix = ids + trunk.token_ids[:args.step] + [candidates[i + 1]]
            spec = dataclasses.replace(service.generator.plan(req).specs[0], input_ids=tuple(prefix))
            return service.engine.generate(spec, Sampling(n_new))

        plan = service.describer.plan(DescribeRequest(prompt=DESCRIBED, layer="all", position=4,
                                                      max_tokens=args.describe_tokens))
        ones = [service.describer.plan(DescribeRequest(prompt=DESCRIBED, layer=str(layer), position=4,
                                                       max_tokens=args.describe_tokens)) for layer in plan.layers]
        sweep_req = DescribeRequest(prompt=DESCRIBED, layer="all", position=4, max_tokens=args.describe_tokens)

        runs = {
            "branch": branch,
            "alone": alone,
            "sweep": lambda i: service.describer.describe(sweep_req, plan),
            "sequential": lambda i: [service.describer.describe(
                dataclasses.replace(sweep_req, layer=str(p.layers[0])), p) for p in ones],
        }
        got = {}
        for name, fn in runs.items():
            got[name] = median_time(fn, args.repeats)
            print(f"  ({name}: {got[name]:.3f} s, load average {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
    finally:
        service.close()
    got["branch/alone"] = got["branch"] / got["alone"]
    got["sweep/sequential"] = got["sweep"] / got["sequential"]
    cells = {"branch": n_new * info.n_layers, "alone": (len(ids) + args.step + 1 + n_new - 1) * info.n_layers}
    print(f"{len(ids)}-token prompt, {args.tokens} tokens, branched at step {args.step} ({n_new} new), every layer, "
          f"logit lens; {len(plan.layers)}-layer sweep of {args.describe_tokens} tokens; vLLM ({info.dtype}), "
          f"medians of {args.repeats}; load average {os.getloadavg()[0]:.1f}:")
    for name, value in got.items():
        print(f"  {name:17s} {value:.3f}" + ("" if "/" in name else " s"))
    print(f"  cells read: branch {cells['branch']}, alone {cells['alone']}")
    print(json.dumps({"bench": "road", "prompt_tokens": len(ids), "tokens": args.tokens, "step": args.step,
                      "layers_swept": len(plan.layers), "repeats": args.repeats, "cells": cells,
                      "loadavg": round(os.getloadavg()[0], 2), **{k: round(v, 4) for k, v in got.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

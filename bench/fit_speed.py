"""How fast the Jacobian-lens fitter runs, per prompt and per hour, estimator variant by variant.

    python bench/fit_speed.py --variants old,prefix,default    # the shipped lens's estimator vs the default
    python bench/fit_speed.py --variants all --passes 6        # every variant, from 6 backward passes each
    python bench/fit_speed.py --variants default --threads 1,2 --passes 0    # whole prompts, 1 and 2 threads

Every variant reads the same corpus prompt (`general`'s first T-token window, BOS first, skip 16) on the
embedded model in fp32 (bf16: the model in bf16). A variant's prompt is its forward (the prefix cache's
included) plus its backward passes and copies into J: the first --passes of them timed (0: all), the
rest counted at their mean. Each time is wall and CPU seconds (the process's, every thread), so a
busy machine shows as wall above CPU; the load average is printed before and after, and --rounds
interleaves the variants so a change in load falls on all of them. A table, then one JSON line.

Variants: old (the shipped lens's estimator: every position backpropagated, dim_batch copies of the
forward, 8), prefix (the first `skip` positions as a KV cache, 8 copies), default (the prefix cache and
one copy, the 8 rows of a pass batched through its backward), db16/db32 (its dim_batch), copies32 (32
copies), probes72 (a sketch of 72 probes: faster per prompt, noisier; bench/RESULTS.md has its
quality), bf16 (the model in bf16: this CPU has no native bf16, one pass is timed).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lensapp import config, corpus, fitting  # noqa: E402
from lensapp.engine.start.backend_kinds import FITTING  # noqa: E402
from lensapp.engine.start.loading import ModelError, load_hf_model  # noqa: E402
from lensapp.fitting.estimator import jacobian_rows, prompt_graph  # noqa: E402

VARIANTS = {
    "old": {"prefix_cache": False, "batched": False, "dim_batch": 8},
    "prefix": {"batched": False, "dim_batch": 8},
    "default": {"dim_batch": 8},
    "db16": {"dim_batch": 16},
    "db32": {"dim_batch": 32},
    "copies32": {"batched": False, "dim_batch": 32},
    "probes72": {"dim_batch": 8, "probes": 72},
    "bf16": {"dim_batch": 8, "dtype": "bfloat16"},
}


def clocks() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def time_prompt(model, layout, ids, skip: int, passes: int, *, dim_batch: int, prefix_cache: bool = True,
                batched: bool = True, probes: int = 0, dtype: str = "float32") -> dict:
    """One prompt of one variant: forward and per-pass seconds (wall, CPU), extrapolated to the whole prompt."""
    t0, c0 = clocks()
    graph = prompt_graph(model, layout, ids, skip, 1 if batched else dim_batch, prefix_cache=prefix_cache)
    t1, c1 = clocks()
    d_model = graph.target.shape[-1]
    rows = probes or d_model
    needed = math.ceil(rows / dim_batch)
    run = min(passes or needed, needed)
    eye = torch.eye(d_model)
    for p in range(run):
        jacobian_rows(graph, eye[p * dim_batch:min(rows, (p + 1) * dim_batch)], retain=p < run - 1)
    t2, c2 = clocks()
    wall = (t1 - t0) + needed * (t2 - t1) / run
    cpu = (c1 - c0) + needed * (c2 - c1) / run
    return {"forward_s": t1 - t0, "pass_s": (t2 - t1) / run, "passes": needed, "timed_passes": run,
            "prompt_s": wall, "prompt_cpu_s": cpu}


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


def main(argv: list[str] | None = None) -> int:
    config.prepare_process_environment()       # before nnsight is imported
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default="old,prefix,default",
                        help=f"comma-separated, or 'all': {', '.join(VARIANTS)}")
    parser.add_argument("--threads", default="1", help="torch CPU threads, comma-separated to compare")
    parser.add_argument("--passes", type=int, default=0, help="backward passes timed per prompt (0: all)")
    parser.add_argument("--rounds", type=int, default=1, help="timed rounds (median), after one untimed")
    parser.add_argument("--tokens", type=int, default=64, help="T: tokens per prompt")
    parser.add_argument("--skip", type=int, default=16, help="leading positions not fitted")
    parser.add_argument("--model", default=None, help="'embedded' (default), a hub id or a local folder")
    args = parser.parse_args(argv)
    names = list(VARIANTS) if args.variants == "all" else args.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown or args.passes < 0 or args.rounds < 1:
        parser.error(f"unknown variants {unknown}" if unknown else "--passes >= 0 and --rounds >= 1")
    threads = [int(t) for t in args.threads.split(",")]
    models = {}
    try:
        for dtype in {VARIANTS[n].get("dtype", "float32") for n in names}:
            cfg = config.replace(config.from_args(None), model=args.model or config.EMBEDDED, backend=FITTING.name)
            models[dtype] = load_hf_model(cfg.engine, device="cpu", dtype=dtype)
    except ModelError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    model, resolved = next(iter(models.values()))
    layout = resolved.family.hf
    chunks, _ = corpus.split_holdout(corpus.load_corpus("general"))
    window = corpus.token_windows(chunks[:1], model.tokenizer, args.tokens)[0]
    ids = fitting.prompt_ids(window, model.tokenizer, args.tokens, model.tokenizer.bos_token_id)
    load_before = load_average()
    results = {(n, t): [] for t in threads for n in names}
    for m, _ in models.values():
        for p in m._module.parameters():
            p.requires_grad_(False)
    for r in range(args.rounds + 1):
        for t in threads:
            torch.set_num_threads(t)
            for n in names:
                kw = dict(VARIANTS[n])
                m = models[kw.get("dtype", "float32")][0]
                # bf16 is ~20x slower here: one pass tells enough, and the untimed round is skipped for it.
                passes = 1 if kw.get("dtype") == "bfloat16" else args.passes
                if r == 0 and kw.get("dtype") == "bfloat16":
                    continue
                x = time_prompt(m, layout, ids, args.skip, passes, **kw)
                if r:
                    results[(n, t)].append(x)
    load_after = load_average()
    rows = []
    print(f"\n{resolved.name}, T={ids.shape[0]} (BOS first), skip {args.skip}, load average {load_before} before, "
          f"{load_after} after, {os.cpu_count()} CPUs\n")
    print("| variant | threads | dim_batch | forward s | s / pass | passes | s/prompt | CPU s/prompt | prompts/h |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (n, t), xs in results.items():
        med = {k: statistics.median(x[k] for x in xs) for k in xs[0]}
        row = {"variant": n, "threads": t, "dim_batch": VARIANTS[n]["dim_batch"], **{k: round(v, 3) for k, v in
                                                                                     med.items()},
               "prompts_per_hour": round(3600 / med["prompt_s"], 1)}
        rows.append(row)
        print(f"| {n} | {t} | {row['dim_batch']} | {med['forward_s']:.2f} | {med['pass_s']:.3f} | "
              f"{int(med['passes'])} ({int(med['timed_passes'])} timed) | {med['prompt_s']:.1f} | "
              f"{med['prompt_cpu_s']:.1f} | {row['prompts_per_hour']:.1f} |")
    print(json.dumps({"bench": "fit_speed", "model": resolved.name, "T": int(ids.shape[0]), "skip": args.skip,
                      "rounds": args.rounds, "load_before": load_before, "load_after": load_after,
                      "torch": torch.__version__, "results": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

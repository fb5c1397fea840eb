"""Two-hop curves of several lens files side by side, from `lensapp evaluate --json` outputs.

Examples:
    lensapp evaluate --json > shipped.json
    lensapp evaluate --json --jlens my_lens.pt > new.json
    python bench/evaluation_curves.py shipped=shipped.json new=new.json

Prints a markdown table, one row per layer: for each file, the share of its items whose intermediate is within
the Jacobian lens's and the logit lens's top k (default 10) at that layer; then each file's "some
layer" rates and their ratio. Each file is read as it was evaluated (the app reads with BOS first for a lens
fitted so, the logit lens beside it too), so a file's two lenses always share one reading.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def curves(path: str, k: int) -> dict:
    """{"J": [...], "logit": [...], "layers": [...], "some": {lens: rate}} from one evaluation's JSON."""
    result = json.loads(Path(path).read_text())
    lenses = result["lenses"]
    layers = lenses["logit"]["layers"]
    rates = {name: lenses[key]["hit_rate"][str(k)] for name, key in (("J", "jacobian"), ("logit", "logit"))}
    some = {name: lenses[key]["some_layer"][str(k)] for name, key in (("J", "jacobian"), ("logit", "logit"))}
    return {"layers": layers, **rates, "some": some, "n_items": result["n_items"], "split": result["split"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", help="LABEL=FILE, one `lensapp evaluate --json` output each")
    parser.add_argument("--k", type=int, default=10, help="hit@k (1 or 10)")
    args = parser.parse_args(argv)
    try:
        runs = {label: curves(path, args.k) for label, path in (f.split("=", 1) for f in args.files)}
    except (ValueError, OSError, KeyError) as e:
        print(f"error: {type(e).__name__}: {e} (each argument is LABEL=FILE of `lensapp evaluate --json`)",
              file=sys.stderr)
        return 2
    layers = next(iter(runs.values()))["layers"]
    header = [f"{label} {lens}" for label in runs for lens in ("J", "logit")]
    counts = ", ".join(f"{label}: {r['n_items']} {r['split']} items" for label, r in runs.items())
    print(f"hit@{args.k} of the intermediate by layer ({counts})\n")
    print("| layer | " + " | ".join(header) + " |")
    print("|---:|" + "---:|" * len(header))
    for i, layer in enumerate(layers):
        cells = [f"{r[lens][i]:.1%}" for r in runs.values() for lens in ("J", "logit")]
        print(f"| {layer} | " + " | ".join(cells) + " |")
    some = [f"{r['some'][lens]:.1%}" for r in runs.values() for lens in ("J", "logit")]
    print("| some layer | " + " | ".join(some) + " |")
    for label, r in runs.items():
        ratio = r["some"]["J"] / r["some"]["logit"] if r["some"]["logit"] else float("inf")
        print(f"\n{label}: J / logit at some layer, hit@{args.k}: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

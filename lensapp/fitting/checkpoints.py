"""A fit's running state on disk: checkpoints to resume from, the convergence CSV, interim lenses.

A checkpoint holds the running fp32 sum of per-prompt Jacobians with its count, the corpus
cursor and the per-prompt history; it is written atomically, so a fit killed mid-write resumes
from the previous one. Its key (model, shape, T, skip, a fingerprint of the prompts) makes a run
with other settings or another corpus refuse to resume rather than mix them.
"""

from __future__ import annotations

import csv
import datetime
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from .. import jlens
from .estimator import FitError

CSV_COLUMNS = ["prompt", "n_tokens", "delta", "identity_distance", "seconds"]


@dataclass
class FitState:
    total: torch.Tensor                 # [n_sources, d_model, d_model] fp32 running sum
    n: int = 0                          # prompts in the sum
    cursor: int = 0                     # next corpus item
    deltas: list = field(default_factory=list)
    rows: list = field(default_factory=list)   # convergence CSV rows
    seconds: float = 0.0

    def converged(self, min_prompts: int, window: int, threshold: float) -> bool:
        recent = self.deltas[-window:]
        return self.n >= min_prompts and len(recent) == window and sum(recent) / len(recent) < threshold


def checkpoint_path(out_path: str | Path, checkpoint_dir: str | Path) -> Path:
    return Path(checkpoint_dir) / f"{Path(out_path).stem}.ckpt.pt"


def convergence_path(out_path: str | Path) -> Path:
    out_path = Path(out_path)
    return out_path.with_name(f"{out_path.stem}_convergence.csv")


def prompts_fingerprint(prompts: Sequence) -> str:
    h = hashlib.sha1()
    for c in prompts:
        h.update((c if isinstance(c, str) else " ".join(map(str, c))).encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def save_checkpoint(path: Path, key: dict, state: FitState, provenance: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"key": key, "provenance": provenance, "total": state.total, "n": state.n, "cursor": state.cursor,
                "deltas": state.deltas, "rows": state.rows, "seconds": state.seconds}, tmp)
    os.replace(tmp, path)  # atomic: a run killed mid-write leaves the previous checkpoint


def read_checkpoint(path: Path) -> dict:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise FitError(f"checkpoint {path} is unreadable ({type(e).__name__}); delete it to start over") from e


def load_checkpoint(path: Path, key: dict) -> FitState | None:
    """The state to resume from, None when there is none, FitError when it belongs to another fit."""
    if not path.exists():
        return None
    raw = read_checkpoint(path)
    for name, value in key.items():
        if raw["key"].get(name) != value:
            raise FitError(f"checkpoint {path} has {name}={raw['key'].get(name)!r} but this run has {value!r}; "
                           "delete it or choose another --out")
    return FitState(total=raw["total"].float(), n=raw["n"], cursor=raw["cursor"], deltas=list(raw["deltas"]),
                    rows=[list(r) for r in raw["rows"]], seconds=raw["seconds"])


def write_csv(path: Path, rows: list) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(CSV_COLUMNS)
        writer.writerows(rows)


def save_lens(out_path: Path, state: FitState, provenance: dict, *, converged: bool, dtype: torch.dtype) -> Path:
    """The running mean as a lens file, with what the fit records about itself."""
    mean = state.total / state.n
    provenance = dict(provenance, n_prompts=state.n, final_delta=state.deltas[-1] if state.deltas else None,
                      converged=bool(converged), fit_seconds=round(state.seconds, 1),
                      date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    return jlens.save(out_path, {layer: mean[layer] for layer in range(mean.shape[0])},
                      n_prompts=state.n, provenance=provenance, dtype=dtype)


def snapshot(out_path: str | Path, checkpoint_dir: str | Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write the running mean of a (possibly still running) fit's checkpoint as an interim lens,
    with its convergence CSV beside it."""
    ckpt = checkpoint_path(out_path, checkpoint_dir)
    if not ckpt.exists():
        raise FitError(f"no checkpoint {ckpt} for {out_path}")
    raw = read_checkpoint(ckpt)
    state = FitState(total=raw["total"].float(), n=raw["n"], deltas=list(raw["deltas"]), seconds=raw["seconds"])
    if state.n == 0:
        raise FitError(f"checkpoint {ckpt} has no prompts yet")
    path = save_lens(Path(out_path), state, raw["provenance"], converged=False, dtype=dtype)
    write_csv(convergence_path(out_path), raw["rows"])
    return path


def merge(paths: Sequence[str | Path], out_path: str | Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Lens files fitted on disjoint prompts -> their n_prompts-weighted mean (fp32 math), saved to `out_path`."""
    if not paths:
        raise FitError("nothing to merge")
    try:
        files = [jlens.read(p) for p in paths]
    except jlens.LensFileError as e:
        raise FitError(str(e)) from e
    first = files[0]
    for path, f in zip(paths, files):
        if f.d_model != first.d_model:
            raise FitError(f"cannot merge {path} (d_model {f.d_model}) with {paths[0]} (d_model {first.d_model})")
        if f.layers != first.layers:
            raise FitError(f"cannot merge {path} (layers {f.layers}) with {paths[0]} (layers {first.layers})")
        if f.n_prompts < 1:
            raise FitError(f"cannot merge {path}: it records n_prompts={f.n_prompts}")
    total_n = sum(f.n_prompts for f in files)
    mean = {layer: sum(f.n_prompts * f.J[layer].float() for f in files) / total_n for layer in first.layers}
    provenance = dict(first.provenance)
    provenance.update(n_prompts=total_n, merged_from=[f"{Path(p).name}:{f.n_prompts}" for p, f in zip(paths, files)],
                      converged=all(bool(f.provenance.get("converged")) for f in files),
                      date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    provenance.pop("final_delta", None)
    return jlens.save(out_path, mean, n_prompts=total_n, provenance=provenance, dtype=dtype)

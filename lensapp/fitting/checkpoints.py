"""A fit's running state on disk: checkpoints to resume from, the convergence CSV, interim lenses, and a
lens file taken up again as a running state (`state_from_lens`).

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
from collections.abc import Callable
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
    resumed_from: dict | None = None           # the lens file the sum started from (`state_from_lens`)

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
                "deltas": state.deltas, "rows": state.rows, "seconds": state.seconds,
                "resumed_from": state.resumed_from}, tmp)
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
                    rows=[list(r) for r in raw["rows"]], seconds=raw["seconds"], resumed_from=raw.get("resumed_from"))


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


def read_csv(path: Path) -> list[list]:
    """A convergence CSV's rows, typed as `write_csv` wrote them."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
        return [[int(r["prompt"]), int(r["n_tokens"]), float(r["delta"]), float(r["identity_distance"]),
                 float(r["seconds"])] for r in rows]
    except (OSError, KeyError, TypeError, ValueError) as e:
        raise FitError(f"convergence CSV {path}: unreadable ({type(e).__name__}: {e})") from e


def state_from_lens(path: str | Path, n_layers: int, d_model: int, expected: dict,
                    lengths: Callable[[int], int], n_items: int) -> FitState:
    """A lens file and its convergence CSV as the running state of a fit that continues it.

    The running sum is the file's mean (in the file's dtype, so a bf16 lens brings its rounding) times its
    n_prompts; the CSV gives the deltas for the stop test and the history. `expected` names provenance values
    the file must match where it records them (T, skip, bos, the unembedding, the corpus). `lengths(i)` is the
    token count this run gives corpus item i: the CSV's n_tokens must match them, item by item (an item
    of <= skip + 1 tokens is passed over, as the fit passes it), which checks the corpus order, T and BOS
    even for a file that records none of them. FitError says what differs.
    """
    try:
        lens = jlens.read(path)
    except jlens.LensFileError as e:
        raise FitError(str(e)) from e
    if lens.layers != list(range(n_layers - 1)) or lens.d_model != d_model:
        raise FitError(f"lens {path} has layers {lens.layers[0]}..{lens.layers[-1]} of d_model {lens.d_model}; "
                       f"this model needs 0..{n_layers - 2} of d_model {d_model}")
    for name, value in expected.items():
        if name in lens.provenance and lens.provenance[name] != value:
            raise FitError(f"lens {path} was fitted with {name}={lens.provenance[name]!r} but this run has {value!r}")
    csv_path = convergence_path(path)
    if not csv_path.exists():
        raise FitError(f"lens {path} has no convergence CSV beside it ({csv_path.name}) to continue its stop test")
    rows = read_csv(csv_path)
    if len(rows) != lens.n_prompts or lens.n_prompts < 1:
        raise FitError(f"lens {path} records n_prompts={lens.n_prompts} but its CSV has {len(rows)} rows")
    cursor, skip = 0, expected.get("skip", 0)
    for row in rows:
        while cursor < n_items and lengths(cursor) <= skip + 1:
            cursor += 1
        if cursor >= n_items:
            raise FitError(f"lens {path} was fitted on {len(rows)} prompts; this corpus has fewer")
        if lengths(cursor) != row[1]:
            bos = expected.get("bos")
            raise FitError(f"lens {path}: its prompt {row[0]} had {row[1]} tokens, this run's has {lengths(cursor)}: "
                           f"it was fitted on other prompts (another corpus, T, or "
                           f"{'without' if bos else 'with'} BOS first?)")
        cursor += 1
    total = torch.stack([lens.J[layer].float() for layer in range(n_layers - 1)]) * lens.n_prompts
    digest = hashlib.sha256(Path(lens.path).read_bytes()).hexdigest()[:16]
    return FitState(total=total, n=lens.n_prompts, cursor=cursor, deltas=[r[2] for r in rows], rows=rows,
                    seconds=float(lens.provenance.get("fit_seconds") or sum(r[4] for r in rows)),
                    resumed_from={"file": Path(lens.path).name, "sha256": digest, "n_prompts": lens.n_prompts,
                                  "dtype": str(lens.J[0].dtype).removeprefix("torch."),
                                  "date": lens.provenance.get("date"),
                                  "note": "running sum restarted as the file's mean x n_prompts, deltas from its CSV"})

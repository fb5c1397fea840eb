"""The fit: one prompt at a time into a running mean, checkpointed, until it converges.

The lens is the running mean over prompts (fp32) of `estimator.prompt_jacobian`, stopped once the
mean relative change ||dM||_F / ||M||_F over the last `window` prompts is below `threshold` (after
`min_prompts`), at `max_prompts`, or when the prompts run out. The model is nnsight's
TransformersModel (vLLM has no backward pass), loaded as the engine's transformers backend loads it.
A fit starts from its checkpoint when there is one, else from `resume_from`'s lens file, else from zero.
A sketched fit (`probes`) draws prompt i's probes from a generator seeded with i, so a resumed fit
draws what an uninterrupted one would.
"""

from __future__ import annotations

import contextlib
import math
import platform
import time
from pathlib import Path
from typing import Callable, Sequence

import torch

from .. import jlens
from ..engine.run.families import Layout
from ..provenance import library_versions, unembedding_fingerprint
from .checkpoints import (
    FitState,
    checkpoint_path,
    convergence_path,
    load_checkpoint,
    prompts_fingerprint,
    save_checkpoint,
    save_lens,
    state_from_lens,
    write_csv,
)
from .estimator import decoder_layers, frozen, prompt_jacobian
from .parallel import jacobians_in_order
from .settings import FitConfig, FitError

SAVE_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def prompt_ids(prompt, tokenizer, tokens: int, bos_id: int | None = None) -> torch.Tensor:
    """A corpus item (text, or token ids already) -> int64 ids [<= tokens], bos_id first when given."""
    if isinstance(prompt, str):
        if tokenizer is None:
            raise FitError("text prompts need a tokenizer")
        prompt = tokenizer(prompt, add_special_tokens=True)["input_ids"]
    return torch.as_tensor(jlens.with_bos(prompt, bos_id)[:tokens], dtype=torch.long)


def hardware(device: str) -> str:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    if device.startswith("cuda") and torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}"
    return f"{cpu}, {torch.get_num_threads()} torch thread(s), torch {torch.__version__}"


def one_by_one(model, layout: Layout, items, cfg: FitConfig, state: FitState):
    """(index, ids, J, seconds) for each (index, ids) of `items`, fitted here; a sketch draws around the running
    mean as it is when the loop asks for the prompt, with probes seeded by the prompt's index."""
    for index, ids in items:
        t0 = time.perf_counter()
        J = prompt_jacobian(model, layout, ids, cfg.skip, cfg.dim_batch, prefix_cache=cfg.prefix_cache,
                            batched=cfg.batched_cotangents, probes=cfg.probes,
                            control=state.total / state.n if state.n else None,
                            generator=torch.Generator().manual_seed(index) if cfg.probes else None)
        yield index, ids, J, time.perf_counter() - t0


def fit(model, layout: Layout, prompts: Sequence, cfg: FitConfig, out_path: str | Path, *, tokenizer=None,
        progress: bool = True, provenance: dict | None = None, load: Callable | None = None) -> Path:
    """Fit a lens for `model` (a TransformersModel whose blocks are where `layout` says) on `prompts` and
    `jlens.save` it to `out_path`.

    `prompts` are token-id lists (or texts, of which the first T tokens are used).
    Resumes from `cfg.checkpoint_dir/<out stem>.ckpt.pt` when it exists and was made for the same
    model, T, skip and corpus (raising FitError when it was not). `provenance` adds keys such as
    `model` and `corpus` to what the fit records itself. Writes `<out stem>_convergence.csv` beside.
    With `cfg.workers` > 1, `load()` (picklable) gives each worker process its own model (parallel.py).
    """
    from tqdm.auto import tqdm

    out_path = Path(out_path)
    module = model._module                      # the torch model under nnsight's TransformersModel
    n_layers, d_model = len(decoder_layers(module, layout)), int(module.config.hidden_size)
    if not prompts:
        raise FitError("the corpus is empty")
    base = {"model": getattr(module.config, "name_or_path", "") or type(module).__name__, "corpus": "custom"}
    base.update(provenance or {})
    base["unembedding"] = unembedding_fingerprint(module.get_output_embeddings().weight)
    # What the numbers were computed under: the libraries' releases, and the model's hub revision where it has one.
    base["versions"] = library_versions()
    revision = getattr(module.config, "_commit_hash", None)
    if isinstance(revision, str) and revision:
        base["revision"] = revision
    bos_id = getattr(tokenizer, "bos_token_id", None) if cfg.bos else None
    base["bos"] = bos_id is not None
    base.update({"T": cfg.tokens, "skip": cfg.skip, "dim_batch": cfg.dim_batch,
                 "dtype": str(next(module.parameters()).dtype).removeprefix("torch."), "device": cfg.device,
                 "hardware": hardware(cfg.device), "threshold": cfg.threshold, "window": cfg.window})
    key = {"model": str(base["model"]), "n_layers": n_layers, "d_model": d_model, "T": cfg.tokens,
           "skip": cfg.skip, "corpus": prompts_fingerprint(prompts), "bos": base["bos"]}
    if cfg.probes >= d_model:
        raise FitError(f"probes ({cfg.probes}) must be below d_model ({d_model}); 0 is the exact estimate")
    base.update(prefix_cache=cfg.prefix_cache, probes=cfg.probes)
    ckpt = checkpoint_path(out_path, cfg.checkpoint_dir)
    state = load_checkpoint(ckpt, key)
    if state is None and cfg.resume_from:
        expected = {"T": cfg.tokens, "skip": cfg.skip, "bos": base["bos"], "unembedding": base["unembedding"],
                    "corpus": base["corpus"]}
        state = state_from_lens(cfg.resume_from, n_layers, d_model, expected, n_items=len(prompts),
                                lengths=lambda i: int(prompt_ids(prompts[i], tokenizer, cfg.tokens, bos_id).shape[0]))
    state = state or FitState(total=torch.zeros(n_layers - 1, d_model, d_model))
    if state.resumed_from:
        base["resumed_from"] = state.resumed_from

    def done() -> bool:
        return (state.n >= cfg.max_prompts or state.cursor >= len(prompts)
                or state.converged(cfg.min_prompts, cfg.window, cfg.threshold))

    module.to(cfg.device)
    # The prompts may run out first: that bound gives a true ETA.
    bar = tqdm(total=min(cfg.max_prompts, len(prompts)), initial=state.n, disable=not progress, unit="prompt",
               desc="fit J")
    since_checkpoint = 0
    items = ((i, ids) for i in range(state.cursor, len(prompts))
             if (ids := prompt_ids(prompts[i], tokenizer, cfg.tokens, bos_id)).shape[0] > cfg.skip + 1)
    if cfg.workers > 1:
        if load is None:
            raise FitError("fitting with workers needs a way to load the model in each (`load`)")
        threads = max(1, torch.get_num_threads() // cfg.workers)
        jacobians = jacobians_in_order(load, layout, items, cfg, threads=threads)
        base["workers"] = f"{cfg.workers} processes of {threads} torch thread(s)"
    else:
        jacobians = one_by_one(model, layout, items, cfg, state)
    with frozen(module), bar, contextlib.closing(jacobians):
        while not done():
            index, ids, J, seconds = next(jacobians, (len(prompts) - 1, None, None, 0.0))
            state.cursor = index + 1
            if J is None:                       # the prompts ran out
                break
            old = state.total / max(state.n, 1)
            state.total += J
            state.n += 1
            new = state.total / state.n
            rel = (new - old).flatten(1).norm(dim=1) / new.flatten(1).norm(dim=1).clamp_min(1e-30)
            delta = rel.mean().item()
            identity = (new[-1] - torch.eye(d_model)).norm().item() / math.sqrt(d_model)
            state.deltas.append(delta)
            state.seconds += seconds
            state.rows.append([state.n, int(ids.shape[0]), delta, identity, round(seconds, 3)])
            bar.set_postfix(delta=f"{delta:.2e}", s_per_prompt=f"{seconds:.0f}", refresh=False)
            bar.update(1)
            since_checkpoint += 1
            if since_checkpoint >= cfg.checkpoint_every:
                save_checkpoint(ckpt, key, state, base)
                write_csv(convergence_path(out_path), state.rows)
                since_checkpoint = 0
    if state.n == 0:
        raise FitError(f"no corpus item has more than skip + 1 = {cfg.skip + 1} tokens")
    save_checkpoint(ckpt, key, state, base)
    write_csv(convergence_path(out_path), state.rows)
    converged = state.converged(cfg.min_prompts, cfg.window, cfg.threshold)
    return save_lens(out_path, state, base, converged=converged, dtype=SAVE_DTYPES[cfg.save_dtype])

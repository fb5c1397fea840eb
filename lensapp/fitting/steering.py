"""Fit a steering vector: the small v that, added to the residual leaving block `layer`, makes a target read.

vLLM has no backward pass, so the vector is fitted here, on nnsight's TransformersModel, and brought to
the engine as an `Edit(kind="add")` (the seed's "Optimizing against the lens"). It minimises

    -log p(target) + l2 * (||v|| / n)^2        n = the layer's typical residual norm on this prompt

with Adam from v = 0, where p(target) is read at the prompt's last position either by the lens at
`layer` itself (objective "lens": norm(h + v), or norm((h + v) @ J.T) with a J, then the head; only the
last position's v matters, so v must be added there) or by the model's own output after the edit runs
through the later blocks (objective "output": a forward and a backward pass per step). v is added at the
last position, at every position, or at given ones: where it will be applied. It stops once p(target) >=
threshold, after max_steps, or once max_seconds have passed (checked between each step's forward and
its backward pass).

Scale-free settings: `lr` is in units of n / sqrt(d_model) per coordinate (so an Adam step moves v by
about lr * n), and `l2` weighs (||v|| / n)^2. The fit is deterministic for the same inputs (v starts at
0, the model runs in eval mode, and torch's RNG is forked and seeded), except that a stop by the clock
depends on the machine: `stopped` says which bound ended it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import torch

from ..engine.run.families import Layout, find, hf_logits, residual
from ..interventions import typical_norm
from .estimator import FitError, frozen

OBJECTIVES = ("lens", "output")
WHERE = ("last", "all")


@dataclass(frozen=True)
class SteerConfig:
    """How a steering vector is fitted; every bound is finite."""

    objective: str = "output"    # "lens": the lens at `layer` reads the target; "output": the model's output does
    positions: str | tuple[int, ...] = "last"    # where v is added: "last", "all", or these prompt positions
    threshold: float = 0.5       # stop once p(target) reaches this
    max_steps: int = 200
    max_seconds: float = 120.0
    lr: float = 0.05             # Adam's step, in units of n / sqrt(d_model) per coordinate (module docstring)
    l2: float = 0.01             # weight of (||v|| / n)^2
    seed: int = 0

    def __post_init__(self):
        if self.objective not in OBJECTIVES:
            raise FitError(f"objective {self.objective!r} is not one of {OBJECTIVES}")
        explicit = isinstance(self.positions, tuple) and self.positions and all(
            isinstance(p, int) and p >= 0 for p in self.positions)
        if not explicit and self.positions not in WHERE:
            raise FitError(f"positions {self.positions!r} is not one of {WHERE} or a tuple of prompt positions")
        if not 0 < self.threshold < 1:
            raise FitError(f"threshold must be in (0, 1), got {self.threshold}")
        if self.max_steps < 0 or not self.max_seconds > 0 or not self.lr > 0 or self.l2 < 0:
            raise FitError("max_steps and l2 must be >= 0, max_seconds and lr > 0")


@dataclass
class SteeringVector:
    """vector [d_model] float32 CPU, to add at `layer` (at the positions the config said).

    reached: p >= threshold; steps: Adam steps taken; p: p(target) with this vector; norm: ||vector||;
    typical_norm: the layer's typical residual norm on the prompt (n); stopped: "reached", "max_steps"
    or "time"."""

    vector: torch.Tensor
    layer: int
    reached: bool
    steps: int
    p: float
    norm: float
    typical_norm: float
    stopped: str


Progress = Callable[[int, float, float], None]        # (step, p(target), ||v||)


def fit_steering(model, layout: Layout, ids: list[int], layer: int, target_id: int, cfg: SteerConfig = SteerConfig(),
                 *, J: torch.Tensor | None = None, progress: Progress | None = None) -> SteeringVector:
    """Fit v for `model` (nnsight's TransformersModel, blocks where `layout` says) on the prompt `ids`.

    J [d_model, d_model] (objective "lens" only): read the Jacobian lens at `layer` instead of the logit lens.
    `progress(step, p, norm)` is called before each step and once at the end.
    """
    module = model._module
    n_layers = len(find(module, layout.blocks))
    if not 0 <= layer < n_layers:
        raise FitError(f"layer {layer} is outside 0..{n_layers - 1}")
    if not ids:
        raise FitError("the prompt is empty")
    if J is not None and cfg.objective != "lens":
        raise FitError("a J reads the lens at the layer: it needs objective 'lens'")
    device = next(module.parameters()).device
    ids_t = torch.tensor([ids], device=device)
    with frozen(module), torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        h = _stream(model, layout, ids_t, layer)                              # [P, d] float32, no grad
        n = float(typical_norm(h))
        d = h.shape[-1]
        rows = _rows(cfg.positions, len(ids))
        if cfg.objective == "lens" and len(ids) - 1 not in rows:
            raise FitError("the lens objective reads the last position: the vector must be added there too")
        v = torch.zeros(d, device=device, requires_grad=True)
        opt = torch.optim.Adam([v], lr=cfg.lr * n / math.sqrt(d))
        if cfg.objective == "lens":
            def log_p():
                return _lens_logprob(module, layout, h[-1] + v, target_id, J)
        else:
            def log_p():
                return _output_logprob(model, layout, ids_t, layer, v, rows, target_id)
        start, step, stopped = time.monotonic(), 0, "max_steps"
        while True:
            with torch.enable_grad():
                lp = log_p()
            p = float(lp.detach().exp())
            if progress is not None:
                progress(step, p, float(v.detach().norm()))
            if p >= cfg.threshold:
                stopped = "reached"
                break
            if step >= cfg.max_steps:
                break
            if time.monotonic() - start > cfg.max_seconds:
                stopped = "time"
                break
            loss = -lp + cfg.l2 * (v.norm() / n) ** 2
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
    vector = v.detach().float().cpu()
    return SteeringVector(vector=vector, layer=layer, reached=p >= cfg.threshold, steps=step, p=p,
                          norm=float(vector.norm()), typical_norm=n, stopped=stopped)


def _rows(positions: str | tuple[int, ...], n: int) -> list[int]:
    """The prompt positions v is added at: "last", "all", or the given ones (each inside the prompt)."""
    if positions == "last":
        return [n - 1]
    if positions == "all":
        return list(range(n))
    if max(positions) >= n:
        raise FitError(f"positions {list(positions)} are outside the prompt's 0..{n - 1}")
    return sorted(positions)


def _stream(model, layout: Layout, ids: torch.Tensor, layer: int) -> torch.Tensor:
    """The residual stream leaving block `layer` on the prompt: [P, d_model] float32."""
    import nnsight

    with torch.no_grad(), model.trace(ids, use_cache=False):
        h = nnsight.save(residual(find(model, layout.blocks)[layer].output, layout)[0].float())
    return h


def _lens_logprob(module, layout: Layout, x: torch.Tensor, target_id: int, J: torch.Tensor | None) -> torch.Tensor:
    """log p(target) read by the lens from one stream row x [d_model] (logit lens, or the J lens with J)."""
    if J is not None:
        x = x @ J.to(x.dtype).T
    dtype = next(module.parameters()).dtype
    logits = hf_logits(module.config, find(module, layout.head)(find(module, layout.norm)(x.to(dtype)[None])))
    return logits[0].float().log_softmax(-1)[target_id]


def _output_logprob(model, layout: Layout, ids: torch.Tensor, layer: int, v: torch.Tensor, rows: list[int],
                    target_id: int) -> torch.Tensor:
    """log p(target) of the model's own next token with v added to block `layer`'s output at `rows`."""
    import nnsight

    config = model._module.config
    with model.trace(ids, use_cache=False):
        block = find(model, layout.blocks)[layer]
        out = block.output
        h = residual(out, layout)
        mask = torch.zeros(h.shape[-2], 1, dtype=h.dtype, device=h.device)
        mask[rows] = 1
        new = h + mask * v.to(h.dtype)
        block.output = (new, *out[1:]) if isinstance(out, tuple) else new
        logits = find(model, layout.head).output[0, -1]
        lp = nnsight.save(hf_logits(config, logits).float().log_softmax(-1)[target_id])
    return lp

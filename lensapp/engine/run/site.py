"""How a trace body reaches one backend's model (`Site`), and the defaults of one worker holding all of it.

A backend builds its `Site` and hands it to every trace body (`trace.py`, `components_trace.py`);
it travels into vLLM's worker with each request, so it holds functions and plain values, never tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .families import Layout, find


def one_worker() -> bool:
    """One worker holds every stage: it is the last (the default for a Site)."""
    return True


def every_block(block) -> bool:
    return True


def head_output_logits(model, layout: Layout):
    """The head's output at the last position [vocab] (before soft-capping or scaling, which change no argmax)."""
    return find(model, layout.head).output[0, -1]


def first_rank() -> int:
    """One worker holds every head: rank 0 (the default for a Site)."""
    return 0


@dataclass(frozen=True)
class Site:
    """How a trace body reaches one backend's model. It travels into vLLM's worker with every request,
    so it holds no tensors: `head` is a module-level function (or a partial of one).

    logits: (model, layout) -> the model's own logits at the last position [vocab], as this backend has them:
        the head's output (`head_output_logits`), or vLLM's sampler input (`model.logits`).
    gather: raw logits (`h @ W_U.T`) from this worker's head -> the whole vocab (vLLM splits the head by
        vocab rows across tensor-parallel ranks, padded); None where the head is whole.
    last_stage / runs_here: whether this worker holds the pipeline's last stage (the head), and whether a
        block runs here (not a placeholder for another stage's); one worker holds every stage by default.
    rows: (head module, ids [n]) -> the unembedding's rows [n, d_model], whole on every tensor-parallel rank;
        None where the head's weight is whole (`components`).
    gather_heads: (x, dim) -> x with every rank's attention heads along `dim`; None where one worker holds
        every head (`components`).
    project: (linear module, x) -> x through this rank's slice of its weight, no bias and no sum over ranks;
        None where the weight is a plain tensor (`components`).
    rank: this worker's tensor-parallel rank (`components`: which heads are its own).
    recompute_attention: the attention kernel forms no weights (vLLM's): `components` recomputes them from the
        rotated queries and keys it receives; otherwise it reads the attention module's own (eager) weights.
    """

    layout: Layout
    head: Callable
    d_model: int
    logits: Callable = head_output_logits
    gather: Callable | None = None
    last_stage: Callable[[], bool] = one_worker
    runs_here: Callable[[object], bool] = every_block
    rows: Callable | None = None
    gather_heads: Callable | None = None
    project: Callable | None = None
    rank: Callable[[], int] = first_rank
    recompute_attention: bool = False

"""Prompts' Jacobians from worker processes, handed back in corpus order.

A prompt's estimate is almost all matrix products (bench/RESULTS.md: `aten::mm` 82%), and torch's threads
share them poorly on this project's CPUs: two threads ran a prompt 1.3-1.6x as fast as one, two workers 2.0x
(bench/RESULTS.md, 2026-12-04). Prompts are independent, so N processes of one thread each, every one with
its own copy of the model, fit ~N prompts in the time of one. The loop still folds them one at a time in corpus
order, so the running sum, the deltas, the checkpoints and the lens are those of the one-process fit
(tests/test_fitting.py: equal).

Only the exact estimate runs here: a sketch draws around the running mean, which a worker ahead of the loop
does not have yet. A worker loads the model itself with `load`, a picklable zero-argument callable (processes
are spawned, not forked: torch's OpenMP pool does not survive a fork). Jacobians come back as numpy arrays
through a pipe, not shared memory (a 64 MB /dev/shm holds less than two of the embedded model's).
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import torch

from ..engine.run.families import Layout
from .estimator import frozen, prompt_jacobian
from .settings import FitConfig, FitError

_worker: dict = {}      # this worker process's model and layout (set once by `_start`)


def _start(load: Callable, layout: Layout, device: str, threads: int, parent: int) -> None:
    threading.Thread(target=_exit_with, args=(parent,), name="fit-worker-parent", daemon=True).start()
    torch.set_num_threads(threads)
    model = load()
    model._module.to(device)
    _worker.update(model=model, layout=layout)


def _exit_with(parent: int) -> None:
    """Leave when the fit does. A fit killed outright (SIGKILL, the OOM killer) cannot shut its pool down, and a
    worker waiting for its next prompt would wait for ever, holding its model."""
    while os.getppid() == parent:
        time.sleep(1)
    os._exit(1)


def _jacobian(ids: torch.Tensor, cfg: FitConfig):
    """One prompt's exact estimate in a worker: (J as a numpy array, its seconds)."""
    model, t0 = _worker["model"], time.perf_counter()
    with frozen(model._module):
        J = prompt_jacobian(model, _worker["layout"], ids, cfg.skip, cfg.dim_batch, prefix_cache=cfg.prefix_cache,
                            batched=cfg.batched_cotangents)
    return J.numpy(), time.perf_counter() - t0


def jacobians_in_order(load: Callable, layout: Layout, items: Iterable, cfg: FitConfig, *,
                       threads: int = 1) -> Iterator[tuple[int, torch.Tensor, torch.Tensor, float]]:
    """(index, ids, J, seconds) for each (index, ids) of `items`, in their order, from `cfg.workers` processes.

    Every worker is kept busy: one prompt more than the workers is queued. Closing the iterator (the fit has
    converged) cancels what has not started and waits for the prompts being fitted (at most one each).
    """
    pool = ProcessPoolExecutor(cfg.workers, mp_context=multiprocessing.get_context("spawn"), initializer=_start,
                               initargs=(load, layout, cfg.device, threads, os.getpid()))
    items, pending = iter(items), deque()

    def submit() -> None:
        for index, ids in items:
            pending.append((index, ids, pool.submit(_jacobian, ids, cfg)))
            return

    try:
        for _ in range(cfg.workers + 1):
            submit()
        while pending:
            index, ids, future = pending.popleft()
            submit()
            try:
                J, seconds = future.result()
            except BrokenProcessPool as e:
                raise FitError(f"a fit worker stopped before its prompt was done ({e}): fit with --workers 1 "
                               "to see why") from e
            yield index, ids, torch.from_numpy(J), seconds
    finally:
        pool.shutdown(wait=True, cancel_futures=True)

"""The steering fitter's own process: the model's float32 copy, its gradients and its threads, kept apart.

A fitted steering vector needs backward passes, which vLLM does not have, so it is fitted on nnsight's
TransformersModel (`steering.fit_steering`). Doing that in the web process would load a second copy of
the model there and hold the interpreter through each step's tracing, slowing every visitor's page. So
the fits run in one child process, started at the first fit and kept: it loads the model once, runs
at most `threads` torch threads, and answers one job at a time over a pipe, sending each step's
progress. A fit that overruns its clock (the loop checks it inside each step; this is the net under
that) has its process killed; the next fit starts a fresh one. So has a fit its caller abandons mid-way (its
`progress` raising, or anything else between the job sent and its answer): left running, it would hold the core
and send its answer down the pipe, where the next job would read it as its own. Every message also carries its
job's number, and the parent takes only its own job's: a job is never handed another's answer.
"""

from __future__ import annotations

import functools
import logging
import multiprocessing
import os
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)

START_GRACE = 120.0        # seconds a new process may take to load the model, beyond the fit's own bound
# A fit is background work beside the engine every visitor waits on: on a 2-core host it took one core of
# two for its whole clock, and vLLM's worker threads, sharing the other, stalled at their barriers (a short lens
# 0.4 s alone took 8 s in bench/workshop.py). Niced, the fitter gets what the engine leaves; a fit slowed so
# far stops at its clock with what it has (`steering.SteeringVector.stopped`), as on any slow machine.
FIT_NICENESS = 10


class FitStopped(RuntimeError):
    """The fitter's process overran its time or died; the message says which, in one line."""


@dataclass(frozen=True)
class FitJob:
    ids: tuple[int, ...]
    layer: int
    target_id: int
    steer: object                    # steering.SteerConfig (imported in the child, where torch is)


class FitWorker:
    """One child process that fits steering vectors for the model `engine` (config.EngineSettings) names, one job
    at a time (not thread-safe: its caller holds a lock)."""

    def __init__(self, engine, threads: int = 1):
        self.engine, self.threads = engine, threads
        self._process = None
        self._conn = None
        self._jobs = 0                   # jobs sent: each message names its job by this number

    def fit(self, job: FitJob, seconds: float, progress=None):
        """The SteeringVector of `job`, or FitStopped when it takes more than `seconds` (plus, for a process
        that is just starting, the time to load the model) or the process dies."""
        grace = 0.0
        if self._process is None or not self._process.is_alive():
            self._start()
            grace = START_GRACE
        self._jobs += 1
        try:
            self._conn.send((self._jobs, job))
        except OSError:                  # it died since: its pipe closed
            self.close()
            raise FitStopped("the fitter's process died (out of memory?); try again") from None
        try:
            return self._answer(self._jobs, time.monotonic() + seconds + grace + 10.0, seconds, progress)
        except FitStopped:
            raise                        # the process is closed, or idle after its job's error
        except BaseException:
            self.close()                 # abandoned mid-way: it must not go on, nor answer the next job
            raise

    def _answer(self, number: int, deadline: float, seconds: float, progress):
        """Job `number`'s SteeringVector, reading its progress on the way (another job's messages are dropped)."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                raise FitStopped(f"the fit took longer than its {seconds:.0f} s and was stopped")
            if not self._conn.poll(min(left, 1.0)):
                if not self._process.is_alive():
                    self.close()
                    raise FitStopped("the fitter's process died (out of memory?); try again")
                continue
            try:
                of, kind, *rest = self._conn.recv()
            except (EOFError, OSError):                    # the process died mid-fit: its pipe closed
                self.close()
                raise FitStopped("the fitter's process died (out of memory?); try again") from None
            if of != number:
                log.warning("dropped a message of the steering fitter's job %s while waiting for job %s", of, number)
            elif kind == "progress" and progress is not None:
                progress(*rest)
            elif kind == "done":
                return rest[0]
            elif kind == "error":
                raise FitStopped(rest[0])

    def close(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.join(10)
        if self._conn is not None:
            self._conn.close()
        self._process = self._conn = None

    def _start(self) -> None:
        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe()
        self._process = context.Process(target=serve, args=(self.engine, self.threads, child), daemon=True,
                                        name="lensapp-fitter")
        self._process.start()
        child.close()
        self._conn = parent
        log.info("started the steering fitter's process (pid %s)", self._process.pid)


def serve(engine, threads: int, conn) -> None:
    """The child: load the model once, then fit each (number, job) sent, sending (number, "progress", step, p, norm)
    messages and one (number, "done", SteeringVector) or (number, "error", message)."""
    from .. import config

    config.prepare_process_environment()
    os.nice(FIT_NICENESS)
    import torch

    torch.set_num_threads(threads)
    from ..engine.start.loading import load_hf_model
    from .estimator import FitError
    from .steering import fit_steering

    model, resolved = load_hf_model(engine, device="cpu")
    layout = resolved.family.hf
    while True:
        try:
            number, job = conn.recv()
        except EOFError:
            return
        try:
            fit = fit_steering(model, layout, list(job.ids), job.layer, job.target_id, job.steer,
                               progress=functools.partial(_tell_progress, conn, number))
            conn.send((number, "done", fit))
        except FitError as e:
            conn.send((number, "error", str(e)))


def _tell_progress(conn, number: int, step: int, p: float, norm: float) -> None:
    conn.send((number, "progress", step, p, norm))

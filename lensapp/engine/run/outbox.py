"""Each step of a streamed generation, kept where its trace runs until the app takes it.

nnsight's vLLM integration hands a trace's saves back when its request ends; a generation streamed to a page
needs each step as soon as it is done. So a streamed trace's body also `publish`es every step's readout, under a
key the app made for that request, into the model's outbox: an attribute of the worker's torch model, as the J
stack is (`trace.JLENS_ATTR`). The app takes what was published with one `collective_rpc` per engine step for
every stream in flight (`courier.py`), which vLLM runs between two steps, and the request's saves still carry
every step when it ends: the outbox only brings them early.

Bounded: the steps of a stream whose request was aborted between two takes stay until KEPT_SECONDS pass
(cachetools' TTLCache), and at most MAX_STREAMS streams are kept (the least recently written let go first).

Imported by vLLM's worker by dotted name: torch, cachetools and the standard library only.
"""

from __future__ import annotations

import pickle
import threading

import torch
from cachetools import TTLCache

OUTBOX_ATTR = "lensapp_outbox"    # attribute on the (worker's) model holding its Outbox
TAKE = "lensapp_take_steps"       # the workers' RPC method that hands the outbox over (`take_published`)
KEPT_SECONDS = 600.0
MAX_STREAMS = 1024


class Outbox:
    """key -> [(step, readout on the CPU)], written by trace bodies (nnsight's mediator threads) and taken between
    steps by the RPC: a lock keeps the two apart."""

    def __init__(self):
        self._steps: TTLCache = TTLCache(MAX_STREAMS, KEPT_SECONDS)
        self._lock = threading.Lock()

    def put(self, key: str, step: int, readout) -> None:
        value = on_cpu(readout)
        with self._lock:
            self._steps[key] = [*self._steps.get(key, ()), (int(step), value)]

    def take(self, forget: tuple[str, ...] = ()) -> dict[str, list]:
        """Every stream's steps published since the last take; `forget`: streams that ended (dropped)."""
        with self._lock:
            for key in forget:
                self._steps.pop(key, None)
            taken = dict(self._steps.items())
            self._steps.clear()
        return taken


def outbox_of(module) -> Outbox:
    """The model's outbox, made on first use (a worker that never streams makes none)."""
    box = getattr(module, OUTBOX_ATTR, None)
    if box is None:
        box = Outbox()
        setattr(module, OUTBOX_ATTR, box)
    return box


def publish(model, key: str, step: int, readout) -> None:
    """In a trace body: this step's readout for the stream `key` (a dict or tuple of tensors)."""
    outbox_of(model._module).put(key, step, readout)


def take_published(module, forget: tuple[str, ...] = ()) -> bytes:
    """The worker's side of the RPC: {key: [(step, readout)]} pickled (vLLM's utility calls carry bytes as they
    are, where a tensor would need its insecure serialization)."""
    return pickle.dumps(outbox_of(module).take(tuple(forget)), protocol=pickle.HIGHEST_PROTOCOL)


def on_cpu(value):
    """`value` (tensors in dicts, tuples and lists) copied to the CPU: a step's readout is a few rows cut from the
    step's buffers, and a view would carry the whole buffer through pickle."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: on_cpu(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(on_cpu(v) for v in value)
    return value

"""What an engine service's answer may carry to a page: tensors, numbers, strings, and lists, tuples and dicts of
them, so that a page reads it with `torch.load(weights_only=True)` and never runs code an answer names.

nnsight-serve answers a trace with `torch.save({"saves": ..., "error": ...})`, whose saves hold whatever the
trace saved, the finished vLLM `RequestOutput` among them (under `RESULT`), and which nnsight's own client reads
back with an unrestricted unpickler: whoever answers in the engine's place, or sits on the path, would run code
in the page. So the service (`lensapp engine`, which made the answer in its own process) reduces it to
`plain` data, the output to what a page reads of it (`Finished`: each completion's token ids), before it leaves;
the page reads only that (`read_reply`), and anything else is refused in one line.

Deals in the answer's form only: what the saves mean is the traces' business (trace.py, vllm_backend.py).
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field

import torch

RESULT = "__lensapp_result__"      # the name the sent block saves `tracer.result` under (served.serialize)
SCALARS = (bool, int, float, str, bytes, type(None))


class NotPlain(ValueError):
    """An answer a page does not read: not this module's form, or naming something beyond plain data."""


@dataclass
class Completion:
    """A vLLM CompletionOutput, as much of it as a page reads."""

    token_ids: list[int]
    finish_reason: str | None = None


@dataclass
class Finished:
    """A finished vLLM RequestOutput, as much of it as a page reads: `outputs[i].token_ids`, and the trace's
    saves on `.saves` (served.finished puts them there, as nnsight's async engine does)."""

    outputs: list[Completion]
    finished: bool = True
    saves: dict = field(default_factory=dict)


def plain(value, where: str = "saves"):
    """`value` as plain data (tensors detached on the CPU); TypeError naming the first thing that is not."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().as_subclass(torch.Tensor)
    if isinstance(value, SCALARS):
        return value
    if isinstance(value, (list, tuple)):       # a named tuple travels as a tuple
        items = [plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, dict):
        return {plain(k, f"{where} key"): plain(v, f"{where}[{k!r}]") for k, v in value.items()}
    raise TypeError(f"{where} is a {type(value).__module__}.{type(value).__qualname__}, which an engine service "
                    "does not send to a page (tensors, numbers, strings, lists, tuples and dicts only)")


def reduce_output(output) -> dict | None:
    """A vLLM RequestOutput as the plain dict `Finished` is read back from."""
    if output is None:
        return None
    return {"outputs": [{"token_ids": [int(t) for t in c.token_ids], "finish_reason": c.finish_reason}
                        for c in output.outputs], "finished": bool(output.finished)}


def plain_reply(raw: bytes) -> bytes:
    """The service's side: nnsight-serve's answer (made in this process, so read unrestricted) made plain. A
    trace that saved something else gets a deferred error naming it, as its own error would come back."""
    reply = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=False)
    return plain_bytes(plain_answer(reply.get("saves"), reply.get("error")))


def plain_answer(saves: dict | None, error) -> dict:
    """A trace's answer, its saves and its deferred error (on this service's side), as the plain dict a page reads
    (`read_answer`); a trace that saved something else gets a deferred error naming it."""
    saves = dict(saves or {})
    if RESULT in saves:
        saves[RESULT] = reduce_output(saves[RESULT])
    try:
        return {"saves": plain(saves), "error": plain(error, "error")}
    except TypeError as e:
        return {"saves": {}, "error": {"type_name": "TypeError", "message": str(e), "traceback": "",
                                       "is_control_flow": False}}


def plain_bytes(value) -> bytes:
    """Plain data as it travels: torch.save's form, read back with `read_plain`."""
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def read_plain(content: bytes):
    """The page's side: what `plain_bytes` wrote, read with torch's weights-only unpickler (NotPlain for anything
    else: it refuses every global it does not know)."""
    try:
        return torch.load(io.BytesIO(content), map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - an UnpicklingError, or whatever garbage raises: all mean "not plain"
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise NotPlain(first[:200]) from None


def read_reply(content: bytes) -> tuple[dict, dict | None]:
    """The page's side: (saves, deferred error or None) of a plain answer, the output as `Finished`; NotPlain
    for anything else (torch's weights-only unpickler refuses every global it does not know)."""
    return read_answer(read_plain(content))


def read_answer(reply) -> tuple[dict, dict | None]:
    """`read_reply` of an answer already read as plain data (the last frame of a stream: served_stream.py)."""
    if not (isinstance(reply, dict) and isinstance(reply.get("saves"), dict)
            and isinstance(reply.get("error"), (dict, type(None)))):
        raise NotPlain("not a dict of saves and an error")
    saves = dict(reply["saves"])
    output = saves.get(RESULT)
    if isinstance(output, dict):
        try:
            saves[RESULT] = Finished([Completion(list(c["token_ids"]), c.get("finish_reason"))
                                      for c in output["outputs"]], bool(output.get("finished", True)))
        except (KeyError, TypeError) as e:
            raise NotPlain(f"its request output lacks {e}") from None
    elif output is not None:
        raise NotPlain(f"its request output is a {type(output).__name__}")
    return saves, reply["error"]

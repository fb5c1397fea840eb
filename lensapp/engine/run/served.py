"""A model whose traces run on an nnsight-serve engine: the client half of `lensapp engine`.

`ServedVLLM` is nnsight's VLLM built as a meta model (config and tokenizer; no weights, no engine) whose
every trace goes to a running nnsight-serve (`POST /v1/nnsight/generate`) in the form nnsight's own
`trace(..., serve=url)` and NDIF's remote path send: the block's source, the names it reads, and the
tracer, with the model's modules as persistent ids the server resolves to its own. Functions the block
calls (`trace.lens_trace`, ...) travel by reference, so the server imports them: it runs this package.

Where nnsight's `serve=` backend sends at the `with` block's exit and waits there, `ServeTrace` sends
when awaited or iterated, so many traces are in flight at once (the engine batches them), and what it
gives is what nnsight's async engine gives (`await tracer.backend`, or `async for` over it): the
finished output (`replies.Finished`: what a page reads of vLLM's `RequestOutput`) with the trace's saves on
`.saves` (iterated: that one output; a streamed generation's each step's output first, `served_stream.py`).
nnsight-serve answers with saved values only, so the block is sent with one
more statement, which saves `tracer.result` (that output) under `RESULT`.

The wire (`Wire`) is nnsight's: its headers (the key as `ndif-api-key`), timeouts and error reading
(`nnsight.modeling.vllm.serve.http`). A service that does not answer is `Unreachable`; a trace's own
error comes back as nnsight re-raises it (a RuntimeError naming the worker's error type). An answer is
read as plain data only (`replies.read_reply`: `lensapp engine` reduces nnsight-serve's before it leaves),
never unpickled unrestricted as nnsight's client does: an answer cannot run code here.

This module knows nothing of lenses: it moves traces.
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass, field

import nnsight
from nnsight.intervention.errors import raise_deferred
from nnsight.intervention.serialization import dumps, reduce_block
from nnsight.modeling.vllm.serve import http
from nnsight.tracing.backend import Backend as TraceBackend

from .errors import one_line
from .protocol import StartFailed, Unreachable
from .replies import RESULT, Finished, NotPlain, read_reply
from .vllm_meta import MetaOnCPUVLLM

_TRACER = "__lensapp_tracer__"     # the sent block's names for its tracer and for nnsight
_NNSIGHT = "__lensapp_nnsight__"
HEALTH_TIMEOUT_S = 5.0
PROGRESS_PATH = "/lensapp/progress"    # the service's engine CPU time (engine_service.py adds it to nnsight-serve)
TRACE_PATH = "/v1/nnsight/generate"    # nnsight-serve's: a serialized trace in, its saves out
# A trace sent with this header is answered 429 at once by a service that is full (engine_service.BusyDoor),
# instead of waiting in its queue: the pool (engines.py) then asks another engine.
BUSY_HEADER = "lensapp-fail-if-busy"
ENGINE_DEAD = ("EngineDeadError",)   # vLLM's error for a request on an engine whose core has died


class Busy(Exception):
    """An engine service full (its traces in flight at its limit), asked with BUSY_HEADER: ask another."""


@dataclass(frozen=True)
class Wire:
    """One engine service: its address and key (never in a repr). Every request is one short exchange on
    nnsight's wire."""

    url: str
    key: str = field(default="", repr=False)

    def __post_init__(self):
        object.__setattr__(self, "url", self.url.rstrip("/"))

    def progress(self) -> float:
        """The CPU seconds the service's vLLM processes have spent (`lensapp engine`'s PROGRESS_PATH)."""
        import httpx

        try:
            response = httpx.get(f"{self.url}{PROGRESS_PATH}", headers=http.headers(self.key),
                                 timeout=HEALTH_TIMEOUT_S)
        except httpx.HTTPError as e:
            raise Unreachable(self._away(e)) from None
        self._check(response)
        return float(response.json()["cpu_seconds"])

    def health(self) -> None:
        """Unreachable unless the service answers `GET /health` (nnsight-serve: only once its engine is up)."""
        import httpx

        try:
            response = httpx.get(f"{self.url}/health", timeout=HEALTH_TIMEOUT_S)
        except httpx.HTTPError as e:
            raise Unreachable(self._away(e)) from None
        self._check(response)

    def post(self, blob: bytes, fail_if_busy: bool = False) -> tuple[dict, object]:
        """Send a serialized trace and wait: (saves, deferred error or None). `fail_if_busy`: `Busy` at once if the
        service is full, instead of waiting there."""
        import httpx

        try:
            with httpx.Client(timeout=http.timeout()) as client:
                response = client.post(f"{self.url}{TRACE_PATH}", content=blob, headers=self.headers(fail_if_busy))
        except httpx.HTTPError as e:
            raise Unreachable(self._away(e)) from None
        return self._answer(response)

    async def apost(self, client, blob: bytes, fail_if_busy: bool = False) -> tuple[dict, object]:
        """`post` on an `httpx.AsyncClient` (its connections kept for the next request)."""
        import httpx

        try:
            response = await client.post(f"{self.url}{TRACE_PATH}", content=blob, headers=self.headers(fail_if_busy))
        except httpx.HTTPError as e:
            raise Unreachable(self._away(e)) from None
        return self._answer(response)

    def headers(self, fail_if_busy: bool = False) -> dict:
        """nnsight's headers (the key), with BUSY_HEADER when the request would rather go elsewhere than wait."""
        return http.headers(self.key) | ({BUSY_HEADER: "1"} if fail_if_busy else {})

    def async_client(self):
        import httpx

        return httpx.AsyncClient(timeout=http.timeout())

    def _answer(self, response) -> tuple[dict, object]:
        self._check(response)
        try:
            return read_reply(response.content)
        except NotPlain as e:
            raise StartFailed(f"the engine service at {self.url} answered with what a page does not read ({e}): "
                              "is it `lensapp engine` of this version? (a page loads plain data only)") from None

    def _check(self, response) -> None:
        if response.status_code == 401:
            raise StartFailed(f"the engine service at {self.url} refused this key (give the page the key the "
                              "engine was started with: LENSAPP_ENGINE_KEY or --engine-key-file)")
        if response.status_code == 429:         # full, and asked to say so (BUSY_HEADER)
            raise Busy(f"the engine service at {self.url} is full")
        if response.status_code == 503:         # nnsight-serve is up, its engine not (yet)
            raise Unreachable(f"the engine service at {self.url} is starting (its engine is not ready)")
        try:
            http.check(response)
        except ConnectionError as e:
            raise StartFailed(f"the engine service at {self.url}: {e}", permanent=False) from None

    def _away(self, error: Exception) -> str:
        return f"the engine service at {self.url} does not answer ({one_line(error)})"

    async def astream(self, client, blob: bytes, stream_key: str, fail_if_busy: bool = False):
        """A streamed trace (served_stream.py) on an `httpx.AsyncClient`: its frames (plain data) as the service
        writes them, the answer last. Unreachable until the first frame, StreamBroken after; StartFailed as `post`.
        Closing this generator closes the response, and the service aborts the request."""
        import httpx

        from .served_stream import MEDIA_TYPE, STREAM_KEY_HEADER, STREAM_PATH, StreamBroken, frames_of

        headers = {**self.headers(fail_if_busy), **({STREAM_KEY_HEADER: stream_key} if stream_key else {})}
        framed = False
        try:
            async with client.stream("POST", f"{self.url}{STREAM_PATH}", content=blob, headers=headers) as response:
                if response.status_code != 200 or not response.headers.get("content-type", "").startswith(MEDIA_TYPE):
                    await response.aread()
                    self._check(response)
                    raise StartFailed(f"the engine service at {self.url} does not stream ({STREAM_PATH} answered "
                                      f"{response.headers.get('content-type')!r}): is it `lensapp engine` of this "
                                      "version?", permanent=False)
                async for frame in frames_of(response.aiter_bytes()):
                    framed = True
                    yield frame
        except httpx.HTTPError as e:
            raise (StreamBroken if framed else Unreachable)(self._away(e)) from None
        except NotPlain as e:
            raise StartFailed(f"the engine service at {self.url} streamed what a page does not read ({e}): is it "
                              "`lensapp engine` of this version? (a page loads plain data only)") from None


class ServeTrace(TraceBackend):
    """A trace's backend: serialized at the block's exit, sent when awaited (or at once, `sync`)."""

    def __init__(self, wire: Wire, client=None, sync: bool = False):
        self.wire, self.client, self.sync = wire, client, sync
        self.blob: bytes | None = None
        self.output = None

    def __call__(self, tracer) -> None:
        self.blob = serialize(tracer)
        if self.sync:
            self.output = finished(*self.wire.post(self.blob))

    def __await__(self):
        return self._send().__await__()

    async def __aiter__(self):
        """The async engine's stream, as the service gives it: a streamed trace's (`served_stream.stream_into`) an
        output per step as the service writes it, then the finished one; any other trace's one output, the finished
        one."""
        target = getattr(self, "stream", None)          # set by served_stream.stream_into
        if target is None or self.output is not None:
            yield await self._send()
            return
        from contextlib import aclosing

        from .served_stream import outputs

        async with aclosing(outputs(self, target)) as stream:
            async for output in stream:
                yield output

    async def _send(self):
        if self.output is None:
            self.output = finished(*await self.wire.apost(self.client, self.blob))
            self.blob = None
        return self.output


def serialize(tracer) -> bytes:
    """`RequestModel.serialize`, with the block's last statement saving `tracer.result` under RESULT.

    The with-node is copied, not changed: nnsight memoizes it for every later trace at that site."""
    node = copy.copy(tracer.node)
    save = ast.parse(f"{RESULT} = {_NNSIGHT}.save({_TRACER}.result)").body[0]
    last = node.body[-1]
    ast.fix_missing_locations(ast.increment_lineno(save, (last.end_lineno or last.lineno)))
    node.body = [*node.body, save]
    variables = dict(tracer.info.frame.f_locals) | {_TRACER: tracer, _NNSIGHT: nnsight}
    return dumps((tracer, reduce_block(node, tracer.info.frame.f_globals, variables)))


def finished(saves: dict, error) -> Finished:
    """The finished output the block saved (vLLM's RequestOutput as `replies.Finished`), carrying the trace's
    other saves on `.saves` (as nnsight's async engine gives them). A trace's own error is raised here as nnsight
    raises it (a RuntimeError naming its type); the service's vLLM engine dead under it is `Unreachable` (the
    service then exits, and is waited for)."""
    if error and error.get("type_name") in ENGINE_DEAD:
        raise Unreachable(f"the engine service's vLLM engine died ({error.get('type_name')})")
    raise_deferred(error)
    saves = dict(saves)
    output = saves.pop(RESULT, None)
    if output is None:
        raise RuntimeError(f"the engine service answered without the request's output (saves: {sorted(saves)})")
    output.saves = saves
    return output


class ServedVLLM(MetaOnCPUVLLM):
    """nnsight's VLLM as a meta model (its meta tree builds on a CPU-only torch too: `vllm_meta`) whose traces
    run on the engine service at `wire` (a `Wire`, or a pool of them with its interface: `engines.Engines`). It
    never starts an engine of its own."""

    def __init__(self, *args, wire: Wire, **kwargs):
        self.wire = wire
        self.client = None        # an httpx.AsyncClient, made on the loop that awaits the traces
        super().__init__(*args, **kwargs)

    def trace(self, *inputs, sync: bool = False, **kwargs):
        """A trace sent to the service: awaited (`await tracer.backend`), or, with `sync`, sent at the
        block's exit and read from `tracer.backend.output`."""
        if "backend" not in kwargs:
            if self.client is None and not sync:
                self.client = self.wire.async_client()
            kwargs["backend"] = ServeTrace(self.wire, self.client, sync=sync)
        return super().trace(*inputs, **kwargs)

    def __getstate__(self) -> dict:
        # A trace pickles the model's envoy tree (its modules as persistent ids); the wire stays here.
        state = super().__getstate__()
        state.pop("wire", None)
        state.pop("client", None)
        return state

    def dispatch(self, *args, **kwargs):
        raise RuntimeError("a served model runs on its engine service; it loads no weights here")

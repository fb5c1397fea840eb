"""The app's stable API endpoints: the CLI's JSON, as a dict, for gradio_client.

    from gradio_client import Client
    client = Client("http://127.0.0.1:7860/")
    client.predict("The capital of France is", "both", "all", 5, "Paris", api_name="/lens")
    client.predict("The capital of France is", 8, "logit", "all", 5, 0.0, api_name="/generate")
    client.predict([{"role": "user", "content": "Hi"}], "logit", -1, 16, api_name="/chat")

One endpoint per request kind (`service/kinds.py`), its parameters the kind's request fields in their
declared order (`service/requests.py`); a parameter is only ever added at the end, so calls written for an
earlier version keep working. The functions Gradio sees are made from those declarations: their
signatures, defaults, type hints and the descriptions on the app's "Use via API" page, and every value is
read by its field's parser, as a link's and the command line's are. The answer is the result's JSON,
exactly what the CLI's `--json` prints (string keys only: Gradio serializes it with orjson).

An answer can be large (a long prompt read at every layer with k 100 is ~1M top-k entries, ~30 MB of JSON),
and Gradio walks every answer three times on its event loop looking for files (postprocess, the move to its
cache, the root URL: ~2 s each for that answer, measured), during which the app accepts no request and
answers no page. So an answer for Gradio's queue (gradio_client, the "Use via API" page's Python and
JavaScript) leaves the handler's thread already serialized, as an `orjson.Fragment` that Gradio's walks skip
and its orjson writes out verbatim: the client reads the same JSON. Gradio's REST route (`/call/...`, the
curl example) writes answers with the standard library's json, which cannot embed one: it gets the dict, read
back from the same JSON. That JSON is made once for a result answered again (a shared link, a replayed request:
the result cache's same object; `answer_memo`), and counted against the visitor by its size on both routes.

`/generate` and `/chat` stream (generator endpoints): gradio_client's `submit()` sees one frame per step as the
model writes it ({"frame": "step", "step", "text" so far, and the step's own keys: a `/generate` answer's step, or
a `/chat` token's {token_id, token, readout}}), then the answer; `predict()` returns that answer alone, as before.
A client that leaves (`job.cancel()`, a closed connection) stops the model's work at once.

Bad input raises gr.Error with the service's one-line message, as plain text (the client sees an
AppError). `/health` (plain JSON over GET, not a Gradio endpoint) is added by the server.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import gradio as gr
import orjson

from ..service.field import REQUIRED, Field
from ..service.generating import Partial
from ..service.kinds import KINDS, Kind
from .answer_memo import AnswerMemo

# The answers' JSON kept for results answered again: a quarter of the result cache's own bound (`cache_mb`),
# counted with it in the memory plan (engine/start/memory.py).
MEMO_SHARE = 4


def endpoints() -> tuple[Kind, ...]:
    """One endpoint per request kind."""
    return tuple(KINDS.values())


def register_api(service, guard, web) -> AnswerMemo:
    """Add the endpoints to the Blocks being built (call inside `with gr.Blocks()`); their answers' memo, a share
    of the result cache that `web` (`config.WebSettings`) sizes."""
    memo = AnswerMemo((web.cache_mb << 20) // MEMO_SHARE if web.cache_entries else 0)
    for kind in endpoints():
        gr.api(endpoint_function(kind, service, guard, memo), api_name=kind.name)
    return memo


def endpoint_function(kind: Kind, service, guard, memo: AnswerMemo | None = None) -> Callable:
    """The function Gradio serves for `kind`: its signature, hints and docstring made from its fields."""
    params = kind.fields()
    names = [field.name for field in params]

    def answer_of(result, request):
        if request is None:                         # a call made inside the app: the dict itself
            return kind.answer_of(result)

        def make() -> bytes:
            return orjson.dumps(kind.answer_of(result), default=str)     # as Gradio itself writes an answer

        data = make() if memo is None else memo.json_of(kind.answered(result), make)
        guard.answered(request, len(data))          # a large answer counts as more than one request, on either route
        return sent(data, request)

    def answer(values: dict, request):
        return answer_of(kind.run(service, kind.request_of(values)), request)

    def frames(values: dict, request):
        for item in kind.stream(service, kind.request_of(values)):
            if not isinstance(item, Partial):
                yield answer_of(item, request)
            elif request is None:
                yield item.to_json()
            else:
                yield sent(orjson.dumps(item.to_json(), default=str), request)

    def fn(*args, **kwargs):
        values = dict(zip([*names, "request"], args), **kwargs)
        request = values.pop("request", None)
        return guard.api(request, answer, values, request)

    def streamed(*args, **kwargs):
        values = dict(zip([*names, "request"], args), **kwargs)
        request = values.pop("request", None)
        yield from guard.api_stream(request, frames, values, request)

    fn = fn if kind.stream is None else streamed

    signature = [inspect.Parameter(field.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=api_form(field)[1],
                                   annotation=api_form(field)[0]) for field in params]
    signature.append(inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None,
                                       annotation=gr.Request))
    fn.__signature__ = inspect.Signature(signature, return_annotation=kind.answer)
    fn.__annotations__ = {p.name: p.annotation for p in signature} | {"return": kind.answer}
    fn.__name__ = fn.__qualname__ = kind.name
    fn.__doc__ = "\n".join([kind.summary, "", "Args:", *(f"    {field.name}: {field.help}." for field in params),
                            "Returns:", f"    {kind.returns}"])
    return fn


def sent(data: bytes, request):
    """JSON made here as it leaves: verbatim through Gradio's queue, as a dict on its REST route."""
    return orjson.Fragment(data) if for_queue(request) else orjson.loads(data)


def for_queue(request) -> bool:
    """Whether the answer leaves through Gradio's queue (JSON made here), not its REST route (a dict)."""
    path = getattr(getattr(request, "url", None), "path", None)
    return path is not None and "/call/" not in path


def api_form(field: Field) -> tuple[Any, Any]:
    """(type hint, default) of `field` as an API parameter (inspect's `empty`: required)."""
    hint, default = field.api_form
    return hint, inspect.Parameter.empty if default is REQUIRED else default

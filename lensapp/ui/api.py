"""The app's stable API endpoints: the CLI's JSON, as a dict, for gradio_client.

    from gradio_client import Client
    client = Client("http://127.0.0.1:7860/")
    client.predict("The capital of France is", "both", "all", 5, "Paris", api_name="/lens")
    client.predict("The capital of France is", 8, "logit", "all", 5, 0.0, api_name="/generate")
    client.predict([{"role": "user", "content": "Hi"}], "logit", -1, 16, api_name="/chat")

Each endpoint's parameters are request fields (`service/fields.py`), listed below in their order; a
parameter is only ever added at the end, so calls written for an earlier version keep working. The
functions Gradio sees are made from these lists: their signatures, defaults, type hints and the
descriptions on the app's "Use via API" page all come from the fields, and every value is read by its
field's parser, as a link's and the command line's are.

Bad input raises gr.Error with the service's one-line message, as plain text (the client sees an
AppError). `/health` (plain JSON over GET, not a Gradio endpoint) is added by the server.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable

import gradio as gr

from ..service import ChatRequest, GenerateRequest, InterveneRequest, LensRequest
from ..service import fields as f
from ..service.fields import Field

REQUIRED = inspect.Parameter.empty
# How a field appears in the API where its value's own type is not the whole story: (type hint, default).
# A required field that follows optional ones takes "" (it then says it was not given).
API_FORMS = {f.PROMPT: (str, REQUIRED), f.PROMPTS: (list[str], REQUIRED), f.TARGETS: (str, ""),
             f.SEED: (int | None, None), f.MESSAGES: (list[dict], REQUIRED), f.CHAT_LAYER: (int | None, None),
             f.SPAN: (str, ""), f.ALPHAS: (str, ",".join(f"{a:g}" for a in f.ALPHAS.default))}


@dataclass(frozen=True)
class Endpoint:
    name: str
    summary: str
    params: tuple[Field, ...]
    returns: str
    call: Callable[[Any, dict], Any]          # (service, {field name: raw value}) -> JSON-able answer
    answer: type = dict


def _lens(service, v: dict) -> dict:
    return service.lens(LensRequest.parse(prompts=[v.pop("prompt")], **v))[0].to_json()


ENDPOINTS = (
    Endpoint("lens", "Every layer's lens readout for one prompt.",
             (f.PROMPT, f.LENS, f.LAYERS, f.K, f.TARGETS, f.CHAT, f.RAW, f.SKIP_PUNCTUATION),
             "The CLI's `lens --json` object: tokens, layers, and per lens top_tokens/top_probs [layer][pos][k], "
             "entropy, kl_to_final, targets (with skip_punctuation also display_tokens, display_ranks and "
             "display_probs [layer][pos]: rank 0 where no word was found).", _lens),
    Endpoint("compare", "2 to 4 prompts read the same way, in flight together (aligned at their last token).",
             (f.PROMPTS, f.LENS, f.LAYERS, f.K, f.TARGETS, f.CHAT, f.RAW, f.SKIP_PUNCTUATION),
             "One object per prompt: exactly what /lens returns for that prompt alone.",
             lambda service, v: service.compare(LensRequest.parse(**v)).to_json(), answer=list[dict]),
    Endpoint("generate", "Generate, reading the newest token at every step.",
             (f.PROMPT, f.MAX_TOKENS, f.LENS, f.LAYERS, f.K, f.TEMPERATURE, f.SEED, f.CHAT, f.RAW),
             "The CLI's `generate --json` object: text, tokens, and one readout per step.",
             lambda service, v: service.generate(GenerateRequest.parse(**v)).to_json()),
    Endpoint("chat", "Answer a conversation; each generated token carries one lens's top-k at one layer.",
             (f.MESSAGES, f.CHAT_LENS, f.CHAT_LAYER, f.CHAT_MAX_TOKENS, f.TEMPERATURE, f.CHAT_K, f.SEED),
             "text, tokens, lens, layer, dropped_turns, and readout: per generated token, its top-k {token, prob}.",
             lambda service, v: service.chat(ChatRequest.parse(**v)).to_json()),
    Endpoint("intervene", "Steer, ablate or patch a layer's output, and read every lens before and after.",
             (f.PROMPT, f.KIND, f.WORD, f.SPAN, f.ALPHAS, f.DIRECTION, f.FROM_WORD, f.OBJECTIVE, f.POSITIONS,
              f.PROMPT_ONLY, f.ABLATION, f.REFERENCE, f.SOURCE, f.SOURCE_POSITIONS, f.LENS, f.LAYERS, f.K, f.TARGETS,
              f.NEW_TOKENS, f.TEMPERATURE, f.SEED, f.CHAT, f.RAW),
             "The CLI's `intervene --json` object: before (a /lens object), after (one per alpha, or per layer of a "
             "patch), labels, intervention (what was done), dose_response, and generated text when asked.",
             lambda service, v: service.intervene(InterveneRequest.parse(**v)).to_json()),
)


def register_api(service, guard) -> None:
    """Add the endpoints to the Blocks being built (call inside `with gr.Blocks()`)."""
    for endpoint in ENDPOINTS:
        gr.api(endpoint_function(endpoint, service, guard), api_name=endpoint.name)


def endpoint_function(endpoint: Endpoint, service, guard) -> Callable:
    """The function Gradio serves for `endpoint`: its signature, hints and docstring made from the fields."""
    names = [field.name for field in endpoint.params]

    def fn(*args, **kwargs):
        values = dict(zip([*names, "request"], args), **kwargs)
        request = values.pop("request", None)
        return guard.api(request, endpoint.call, service, values)

    params = [inspect.Parameter(field.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=api_form(field)[1],
                                annotation=api_form(field)[0]) for field in endpoint.params]
    params.append(inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None,
                                    annotation=gr.Request))
    fn.__signature__ = inspect.Signature(params, return_annotation=endpoint.answer)
    fn.__annotations__ = {p.name: p.annotation for p in params} | {"return": endpoint.answer}
    fn.__name__ = fn.__qualname__ = endpoint.name
    fn.__doc__ = "\n".join([endpoint.summary, "", "Args:", *(f"    {field.name}: {field.help}."
                                                            for field in endpoint.params),
                            "Returns:", f"    {endpoint.returns}"])
    return fn


def api_form(field: Field) -> tuple[Any, Any]:
    """(type hint, default) of `field` as an API parameter."""
    if field in API_FORMS:
        return API_FORMS[field]
    return type(field.default), field.default

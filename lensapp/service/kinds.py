"""The request kinds, by name: what each one asks (its request class), what runs it, and where it is published.

Every surface is made from this registry: the API has one endpoint per kind (`ui/api.py`), the command line
one command per kind that has one (`cli.py`: its arguments the fields, its output the result's `to_json()` or
`to_text()`), and a tab's link and inputs are its kind's fields (`ui/permalinks.py`). A new kind is a request
class (`requests.py`), a method of the service, a result with `to_json()` (and `to_text()` for a command), and
an entry here; CONTRIBUTING.md has the recipe.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from . import fields
from .field import Field, fields_of
from .requests import (
    ChatRequest,
    ComponentsRequest,
    DescribeRequest,
    EvaluateRequest,
    GenerateRequest,
    InterveneRequest,
    LensRequest,
)

MAX_CLI_PROMPTS = 64          # prompts a command reads together (a page and the API: config.MAX_COMPARE_PROMPTS)


@dataclass(frozen=True)
class Command:
    """A kind's command, `lensapp NAME` (cli.py). help: its line in `lensapp --help`. run(service, request,
    progress) -> the result, where the command line may ask more than the API (more prompts, a fitted vector's
    steps heard, items from a file); None: the kind's own `run`."""

    help: str
    run: Callable[[Any, Any, Callable | None], Any] | None = None


@dataclass(frozen=True)
class Kind:
    """name: the API endpoint's (and the command's, where `command` is set).
    run(service, request) -> a result (`to_json()`), or a list of them for `lens`.
    stream(service, request) -> each step as it is written (`generating.Partial`: a frame, `to_json()`), then
      `run`'s result: the endpoint streams (None: it answers once).
    one_prompt: the API and links give one `prompt` for the request's `prompts` (the answer: its one result).
    summary, returns: the API's documentation; command: its command line (None: none)."""

    name: str
    request: type
    run: Callable[[Any, Any], Any]
    summary: str
    returns: str
    command: Command | None = None
    one_prompt: bool = False
    answer: type = dict
    stream: Callable[[Any, Any], Any] | None = None

    def run_command(self, service, request, progress: Callable | None = None):
        """The result the command line asks for (`Command.run`, or the API's `run`)."""
        if self.command.run is not None:
            return self.command.run(service, request, progress)
        return self.run(service, request)

    def fields(self) -> tuple[Field, ...]:
        """The request's fields in their published order, as the API and a link show them."""
        declared = tuple(fields_of(self.request).values())
        if self.one_prompt:
            return tuple(fields.PROMPT if f is fields.PROMPTS else f for f in declared)
        return declared

    def request_of(self, values: dict):
        """The request from the raw values of `fields()` (a one-prompt kind's `prompt` becomes its prompts)."""
        values = dict(values)
        if self.one_prompt and "prompt" in values:
            prompt = values.pop("prompt")
            values["prompts"] = None if prompt is None else [fields.PROMPT(prompt)]
        return self.request.parse(**values)

    def answered(self, result):
        """What an answer is made of: the result (a one-prompt kind: the first of its results)."""
        return result[0] if self.one_prompt else result

    def answer_of(self, result) -> Any:
        """The JSON answer of a result."""
        return self.answered(result).to_json()


KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("lens", LensRequest, lambda service, req: service.lens(req),
         "Every layer's lens readout for one prompt.",
         "The CLI's `lens --json` object: tokens, layers, and per lens top_tokens/top_probs [layer][pos][k], "
         "entropy, kl_to_final, targets (with skip_punctuation also display_tokens, display_ranks and "
         "display_probs [layer][pos]: rank 0 where no word was found).",
         command=Command("every layer's readout for one or more prompts, run together",
                         lambda service, req, progress: service.lens(req, MAX_CLI_PROMPTS)), one_prompt=True),
    Kind("compare", LensRequest, lambda service, req: service.compare(req),
         "2 to 4 prompts read the same way, in flight together (aligned at their last token).",
         "One object per prompt: exactly what /lens returns for that prompt alone.", answer=list[dict]),
    Kind("generate", GenerateRequest, lambda service, req: service.generate(req),
         "Generate, reading the newest token at every step.",
         "The CLI's `generate --json` object: text, tokens, and one readout per step. Streamed: each step first, "
         "as it is written ({frame: 'step', step, text so far, and that step's object}), the whole object last.",
         command=Command("generate, with a readout of the newest position at every step"),
         stream=lambda service, req: service.generate_stream(req)),
    Kind("chat", ChatRequest, lambda service, req: service.chat(req),
         "Answer a conversation; each generated token carries one lens's top-k at one layer.",
         "text, tokens, lens, layer, dropped_turns, and readout: per generated token, its top-k {token, prob}. "
         "Streamed: each token first, as it is written ({frame: 'step', step, text so far, token_id, token, "
         "readout}), the whole object last.",
         stream=lambda service, req: service.chat_stream(req)),
    Kind("intervene", InterveneRequest, lambda service, req: service.intervene(req),
         "Steer, ablate or patch a layer's output, and read every lens before and after.",
         "The CLI's `intervene --json` object: before (a /lens object), after (one per alpha, or per layer of a "
         "patch), labels, intervention (what was done), dose_response, and generated text when asked.",
         command=Command("steer, ablate or patch a layer's output, and read every lens before and after",
                         lambda service, req, progress: service.intervene(req, progress))),
    Kind("components", ComponentsRequest, lambda service, req: service.components(req),
         "Who wrote a logit: the embedding's, each attention layer's and head's and each MLP's direct effect on "
         "it, through the final norm frozen at the actual final residual, and where each head looked.",
         "The CLI's `components --json` object: target, foil, position, logit (the raw logit, or target minus "
         "foil), parts {embed, attn [layer], mlp [layer], heads [layer][head], bias, attn_bias [layer]}, sum, "
         "gap, top_attended {positions, weights [layer][head][k]}, and with a patterns layer, patterns "
         "{\"LAYER\": [head][key position 0..position]}.",
         command=Command("who wrote a logit: attention, heads and MLP contributions by layer, and attention "
                         "patterns")),
    Kind("describe", DescribeRequest, lambda service, req: service.describe(req),
         "Describe a cell in words (Patchscopes): block `layer`'s output at `position` replaces block "
         "`inspect_layer`'s output at the inspection prompt's last token in its first forward, and the model goes "
         "on greedily. A layer selection of more than one layer is a sweep, run together.",
         "The CLI's `describe --json`: {layer, position, inspection_prompt, inspect_layer, inspect_position, tokens, "
         "text, token_ids, source_token, prompt, model}; a list of those, one per layer, for a sweep.",
         command=Command("describe a cell in words: its hidden state patched into an inspection prompt "
                         "(Patchscopes)"),
         answer=dict | list[dict]),
    Kind("evaluate", EvaluateRequest, lambda service, req: service.evaluate(req),
         "How good each loaded lens is: on a shipped set of two-hop items, the rank of the unspoken intermediate "
         "(France in 'The capital of the country where the Eiffel Tower stands is') at the prompt's last position, "
         "layer by layer; computed once per model and lens.",
         "The CLI's `evaluate --json` object: model, items, split, n_items, hit_at [1, 10], names, prompts, targets, "
         "intermediates, and per lens {layers, hit_rate {\"1\", \"10\": [layer]}, some_layer {\"1\", \"10\"}, "
         "best_band {\"1\", \"10\": {first, last, best, rate, floor} or null}, target_rate, median_target_rank, "
         "target_rank_last [item], intermediate_rank and target_rank [item][layer]}.",
         command=Command("how good each lens is: the rank of the unspoken intermediate of two-hop items, layer "
                         "by layer", lambda service, req, progress: service.evaluate(req, files=True))),
)}

"""The app's stable API endpoints: the CLI's JSON, as a dict, for gradio_client.

    from gradio_client import Client
    client = Client("http://127.0.0.1:7860/")
    client.predict("The capital of France is", "both", "all", 5, "Paris", api_name="/lens")
    client.predict("The capital of France is", 8, "logit", "all", 5, 0.0, api_name="/generate")
    client.predict([{"role": "user", "content": "Hi"}], "logit", -1, 16, api_name="/chat")

Every option a tab has, the API has; new parameters are only ever added at the end, so calls
written for an earlier version keep working.

Bad input raises gr.Error with the service's one-line message, as plain text (the client sees an
AppError). `/health` (plain JSON over GET, not a Gradio endpoint) is added by the server.
"""

from __future__ import annotations

import gradio as gr

from ..service import ChatRequest, GenerateRequest, LensRequest
from ..service.requests import RequestError, as_flag, as_float, as_int, as_seed, as_text, split_targets


def register_api(service, guard) -> None:
    """Add the endpoints to the Blocks being built (call inside `with gr.Blocks()`)."""

    def lens(prompt: str, lens: str = "logit", layers: str = "all", k: int = 5, targets: str = "",
             chat: bool = False, raw: bool = False, request: gr.Request = None) -> dict:
        """Every layer's lens readout for one prompt.

        Args:
            prompt: the text to read.
            lens: logit | jacobian | both (with "both" and layers="all", the Jacobian lens's layers).
            layers: all | L,L,... | A-B (negative counts from the end).
            k: top-k tokens per cell (1..100).
            targets: comma-separated words to score at every cell.
            chat: wrap the prompt in the tokenizer's chat template.
            raw: raw logits, norm(h) @ W_U.T, skipping the family's logit arithmetic (soft-capping, scale).
        Returns:
            The CLI's `lens --json` object: tokens, layers, and per lens top_tokens/top_probs [layer][pos][k],
            entropy, kl_to_final, targets.
        """
        def run():
            req = LensRequest(prompts=(as_text(prompt, "prompt"),), lens=lens,
                              layers=as_text(layers, "layers") or "all", k=as_int(k, "k"),
                              targets=split_targets(as_text(targets, "targets")), chat=as_flag(chat, "chat"),
                              raw=as_flag(raw, "raw"))
            return service.lens(req)[0].to_json()
        return guard.api(request, run)

    def generate(prompt: str, max_tokens: int = 8, lens: str = "logit", layers: str = "all", k: int = 5,
                 temperature: float = 0.0, seed: int | None = None, chat: bool = False, raw: bool = False,
                 request: gr.Request = None) -> dict:
        """Generate, reading the newest token at every step.

        Args:
            prompt: the prompt.
            max_tokens: tokens to generate (1..64).
            lens: logit | jacobian | both.
            layers: all | L,L,... | A-B.
            k: top-k tokens per cell (1..100).
            temperature: 0 = greedy, up to 2.
            seed: with temperature > 0, the same seed gives the same text (None: a fresh sample each time).
            chat: wrap the prompt in the tokenizer's chat template.
            raw: raw logits (see /lens).
        Returns:
            The CLI's `generate --json` object: text, tokens, and one readout per step.
        """
        def run():
            req = GenerateRequest(prompt=as_text(prompt, "prompt"), max_tokens=as_int(max_tokens, "max_tokens"),
                                  lens=lens, layers=as_text(layers, "layers") or "all", k=as_int(k, "k"),
                                  temperature=as_float(temperature, "temperature"), seed=as_seed(seed),
                                  chat=as_flag(chat, "chat"), raw=as_flag(raw, "raw"))
            return service.generate(req).to_json()
        return guard.api(request, run)

    def chat(messages: list[dict], lens: str = "jacobian", layer: int | None = None, max_tokens: int = 32,
             temperature: float = 0.0, k: int = 3, seed: int | None = None, request: gr.Request = None) -> dict:
        """Answer a conversation, with one lens's top-k at one layer for every token of the reply.

        Args:
            messages: [{"role": "system" | "user" | "assistant", "content": text}, ...], ending with the user's.
            lens: jacobian | logit (the readout's lens).
            layer: the readout's layer (negative counts from the end; None: about two thirds of the depth).
            max_tokens: tokens to generate (1..64).
            temperature: 0 = greedy, up to 2.
            k: top-k per generated token (1..100).
            seed: with temperature > 0, the same seed gives the same reply.
        Returns:
            text, tokens, lens, layer, dropped_turns, and readout: per generated token, its top-k {token, prob}.
        """
        def run():
            n = service.info.n_layers
            at = None if layer is None or layer == "" else as_int(layer, "layer")
            req = ChatRequest(messages=tuple(messages) if isinstance(messages, list) else messages, lens=lens,
                              layer=None if at is None else (at + n if at < 0 else at),
                              max_tokens=as_int(max_tokens, "max_tokens"), k=as_int(k, "k"),
                              temperature=as_float(temperature, "temperature"), seed=as_seed(seed))
            return service.chat(req).to_json()
        return guard.api(request, run)

    def compare(prompts: list[str], lens: str = "logit", layers: str = "all", k: int = 5, targets: str = "",
                chat: bool = False, raw: bool = False, request: gr.Request = None) -> list[dict]:
        """2 to 4 prompts read the same way, in flight together (prompts of different lengths align at the end).

        Args:
            prompts: the prompts, e.g. ["The capital of France is", "The capital of Italy is"].
            lens, layers, k, targets, chat, raw: as for /lens.
        Returns:
            One object per prompt: exactly what /lens returns for that prompt alone.
        """
        def run():
            if not isinstance(prompts, (list, tuple)):
                raise RequestError("prompts must be a list of texts")
            req = LensRequest(prompts=tuple(as_text(p, "a prompt") for p in prompts), lens=lens,
                              layers=as_text(layers, "layers") or "all", k=as_int(k, "k"),
                              targets=split_targets(as_text(targets, "targets")), chat=as_flag(chat, "chat"),
                              raw=as_flag(raw, "raw"))
            return service.compare(req).to_json()
        return guard.api(request, run)

    gr.api(lens, api_name="lens")
    gr.api(compare, api_name="compare")
    gr.api(generate, api_name="generate")
    gr.api(chat, api_name="chat")


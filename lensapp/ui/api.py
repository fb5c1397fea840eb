"""The app's stable API endpoints: the CLI's JSON, as a dict, for gradio_client.

    from gradio_client import Client
    client = Client("http://127.0.0.1:7860/")
    client.predict("The capital of France is", "both", "all", 5, "Paris", api_name="/lens")
    client.predict("The capital of France is", 8, "logit", "all", 5, 0.0, api_name="/generate")

Bad input raises gr.Error with the service's one-line message, as plain text (the client sees an
AppError). `/health` (plain JSON over GET, not a Gradio endpoint) is added by the server.
"""

from __future__ import annotations

import gradio as gr

from ..service import GenerateRequest, LensRequest
from ..service.requests import as_float, as_int, as_text, split_targets


def register_api(service, guard) -> None:
    """Add the endpoints to the Blocks being built (call inside `with gr.Blocks()`)."""

    def lens(prompt: str, lens: str = "logit", layers: str = "all", k: int = 5, targets: str = "",
             request: gr.Request = None) -> dict:
        """Every layer's lens readout for one prompt.

        Args:
            prompt: the text to read.
            lens: logit | jacobian | both (with "both" and layers="all", the Jacobian lens's layers).
            layers: all | L,L,... | A-B (negative counts from the end).
            k: top-k tokens per cell (1..100).
            targets: comma-separated words to score at every cell.
        Returns:
            The CLI's `lens --json` object: tokens, layers, and per lens top_tokens/top_probs [layer][pos][k],
            entropy, kl_to_final, targets.
        """
        def run():
            req = LensRequest(prompts=(as_text(prompt, "prompt"),), lens=lens,
                              layers=as_text(layers, "layers") or "all", k=as_int(k, "k"),
                              targets=split_targets(as_text(targets, "targets")))
            return service.lens(req)[0].to_json()
        return guard.api(request, run)

    def generate(prompt: str, max_tokens: int = 8, lens: str = "logit", layers: str = "all", k: int = 5,
                 temperature: float = 0.0, request: gr.Request = None) -> dict:
        """Generate, reading the newest token at every step.

        Args:
            prompt: the prompt.
            max_tokens: tokens to generate (1..64).
            lens: logit | jacobian | both.
            layers: all | L,L,... | A-B.
            k: top-k tokens per cell (1..100).
            temperature: 0 = greedy, up to 2.
        Returns:
            The CLI's `generate --json` object: text, tokens, and one readout per step.
        """
        def run():
            req = GenerateRequest(prompt=as_text(prompt, "prompt"), max_tokens=as_int(max_tokens, "max_tokens"),
                                  lens=lens, layers=as_text(layers, "layers") or "all", k=as_int(k, "k"),
                                  temperature=as_float(temperature, "temperature"))
            return service.generate(req).to_json()
        return guard.api(request, run)

    gr.api(lens, api_name="lens")
    gr.api(generate, api_name="generate")

"""Patchscopes written again from scratch on plain transformers (fp32, forward hooks, greedy, a KV cache): the
independent reference the app's `describe` is judged by. Nothing here imports the app."""

from __future__ import annotations

import torch


def _stream(output):
    """A decoder layer's output -> its hidden states (transformers 5 returns the tensor; older, a tuple)."""
    return output[0] if isinstance(output, tuple) else output


def state_at(model, ids: list[int], layer: int, position: int) -> torch.Tensor:
    """The residual stream leaving block `layer` at `position` of `ids`: [d_model]."""
    kept = {}

    def keep(module, args, output):
        kept["h"] = _stream(output)[0, position].detach().clone()

    handle = model.model.layers[layer].register_forward_hook(keep)
    try:
        with torch.no_grad():
            model(torch.tensor([ids]))
    finally:
        handle.remove()
    return kept["h"]


def describe(model, ids: list[int], layer: int, position: int, inspect_ids: list[int], inspect_layer: int,
             max_tokens: int) -> list[int]:
    """The greedy tokens after `inspect_ids`, block `inspect_layer`'s output at its last token replaced by block
    `layer`'s output at `position` of `ids`, in the first forward only (later steps read it from the cache)."""
    state = state_at(model, ids, layer, position)
    placeholder = len(inspect_ids) - 1

    def patch(module, args, output):
        h = _stream(output)
        if h.shape[1] > 1:                          # the prompt's forward; a cached step has one token
            h = h.clone()
            h[0, placeholder] = state
            return (h, *output[1:]) if isinstance(output, tuple) else h
        return output

    handle = model.model.layers[inspect_layer].register_forward_hook(patch)
    out, past = [], None
    try:
        with torch.no_grad():
            step = torch.tensor([inspect_ids])
            for _ in range(max_tokens):
                result = model(step, past_key_values=past, use_cache=True)
                past = result.past_key_values
                token = int(result.logits[0, -1].argmax())
                out.append(token)
                step = torch.tensor([[token]])
    finally:
        handle.remove()
    return out


def load(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def greedy(model, ids: list[int], max_tokens: int) -> list[int]:
    """The same prompt's greedy tokens with nothing patched (what a description must differ from somewhere)."""
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=max_tokens, do_sample=False, min_new_tokens=max_tokens)
    return out[0, len(ids):].tolist()

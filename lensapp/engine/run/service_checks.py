"""What a page asks an engine service before trusting its answers: run in the service's worker, inside a trace.

`engine_facts` reads the served model's shape and dtype and the Jacobian lens installed there (by
fingerprint), so a page whose model or lens differs is refused in one line instead of reading another
model's numbers. `stack_fingerprint` is computed the same way on both sides, from the J stack as the
engine holds it (bf16). The worker's fingerprint is computed once per installed stack and kept with it.

Imported by the engine's worker by dotted name (the trace calls `engine_facts` by reference): torch and
the engine's worker-side modules only.
"""

from __future__ import annotations

import hashlib

import torch

from .site import Site
from .stages import is_last_stage
from .trace import JLENS_ATTR


def stack_fingerprint(layers, J: torch.Tensor) -> str:
    """sha256 of the stack's layers and its bf16 values, 16 hex digits."""
    h = hashlib.sha256()
    for layer in layers:
        h.update(int(layer).to_bytes(4, "little"))
    h.update(J.detach().to("cpu", torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes())
    return h.hexdigest()[:16]


def engine_facts(model, site: Site) -> dict:
    """{"n_layers", "d_model", "vocab_size", "dtype", "jlens": fingerprint or ""} of the worker's model."""
    module = model._module
    config = getattr(module, "config", None)
    weight = next(module.parameters())
    installed = getattr(module, JLENS_ATTR, None)
    fingerprint = ""
    if installed is not None:
        if "fingerprint" not in installed:       # the stack is replaced whole on install, and this with it
            installed["fingerprint"] = stack_fingerprint(installed["layers"], installed["J"])
        fingerprint = installed["fingerprint"]
    return {"n_layers": int(getattr(config, "num_hidden_layers", -1)),
            "d_model": int(getattr(config, "hidden_size", site.d_model)),
            "vocab_size": int(getattr(config, "vocab_size", -1)),
            "dtype": str(weight.dtype).removeprefix("torch."), "jlens": fingerprint}


def install_stack(model, site: Site, layers: list[int], J: torch.Tensor) -> dict:
    """Install a page's J stack in the worker (`VLLMBackend.install_jlens`'s, as a function a trace calls by
    reference: the page sends it to each engine of its pool), then `engine_facts`, so the page checks in the same
    request that its stack is the one held. Under pipeline parallelism only the last stage keeps it."""
    module = model._module
    if is_last_stage():
        setattr(module, JLENS_ATTR, {"layers": list(layers), "J": J.to(next(module.parameters()).device)})
    return engine_facts(model, site)


def mismatch(facts: dict, info) -> str | None:
    """Why a page describing its model as `info` (a ModelInfo) cannot use an engine reporting `facts`."""
    mine = {"n_layers": info.n_layers, "d_model": info.d_model, "vocab_size": info.vocab_size, "dtype": info.dtype}
    differ = [f"{k} {facts.get(k)} (the page: {v})" for k, v in mine.items() if facts.get(k) != v]
    if not differ:
        return None
    hint = " (start the page with --dtype " + str(facts.get("dtype")) + ")" if facts.get("dtype") != info.dtype else ""
    return f"the engine service serves another model: {', '.join(differ)}{hint}"

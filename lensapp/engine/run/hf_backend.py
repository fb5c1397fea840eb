"""The model in HF transformers through nnsight's `TransformersModel`: no vLLM needed, and a backward pass.

The engine's fallback backend (a laptop without vLLM, macOS, a GPU where vLLM is not installed)
and the model the lens fitter differentiates. It runs the same trace bodies as vLLM, in this
process, one request at a time: its coroutines never await, so they hold the engine's thread for
their whole run. A multi-prompt batch would need padding, which shifts positions; one trace per
prompt keeps every position where the tokenizer put it.
"""

from __future__ import annotations

import torch

from .components_trace import components_trace
from .families import Family, find, hf_logits
from .protocol import (
    ChatOutput,
    ComponentsOutput,
    ComponentsSpec,
    GenerationOutput,
    JStack,
    LensOutput,
    LensSpec,
    ModelInfo,
    Progress,
    Sampling,
)
from .site import Site
from .trace import JLENS_ATTR, continuation_trace, lens_body, lens_trace


def load_transformers_model(path: str, *, device: str, dtype: torch.dtype):
    """nnsight's TransformersModel, loaded now, in eval mode (this backend and the lens fitter)."""
    from nnsight import TransformersModel

    model = TransformersModel(path, task="text-generation", device_map=device, dtype=dtype, dispatch=True)
    model._module.eval()
    if getattr(model._module.config, "attn_logit_softcapping", None):
        # transformers' SDPA path drops Gemma 2's attention soft-capping without a word; the eager path
        # applies it, as vLLM's kernels do.
        model._module.set_attn_implementation("eager")
    return model


class TransformersBackend:
    concurrent = False           # one trace at a time, on the engine's thread

    def __init__(self, path: str, info: ModelInfo, family: Family, model=None):
        """`model`: an nnsight TransformersModel already built (a bench's random model); else loaded from `path`."""
        self.model = model or load_transformers_model(path, device=info.device, dtype=getattr(torch, info.dtype))
        self.info = info
        self.layout = family.hf
        self.tokenizer = self.model.tokenizer
        self.site = Site(self.layout, self.head, info.d_model)
        self.steps = 0               # traces and generated tokens finished (`progress`)

    def head(self, model, x):
        return hf_logits(model.config, find(model, self.layout.head)(x))

    async def install_jlens(self, stack: JStack) -> None:
        device = next(self.model._module.parameters()).device
        setattr(self.model._module, JLENS_ATTR, {"layers": list(stack.layers), "J": stack.J.to(device)})

    async def run_lens(self, spec: LensSpec) -> LensOutput:
        spec.check(self.info.n_layers, self.info.d_model)
        saved = self._trace(spec.input_ids, lens_trace, spec)
        conts = [self._trace(c.input_ids, continuation_trace, spec, i)["logprobs"]
                 for i, c in enumerate(spec.continuations)]
        return LensOutput(readouts=saved["readouts"], model_next_id=saved["model_next_id"], continuations=conts,
                          kept=saved.get("kept"), norms=saved.get("norms"),
                          after_attention=saved.get("after_attention"))

    async def run_generate(self, spec: LensSpec, sampling: Sampling, sink=None) -> GenerationOutput:
        """The generation in this process: a streamed one's readouts go into `sink` from the trace's body, its
        tokens from transformers' streamer, each as it is made (the sink raising ends the generation there)."""
        import nnsight

        spec.check(self.info.n_layers, self.info.d_model)
        model, site = self.model, self.site
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        how = ({"do_sample": False} if sampling.greedy
               else {"do_sample": True, "temperature": float(sampling.temperature)})
        if sink is not None:
            how["streamer"] = token_streamer(sink)
        with torch.no_grad(), model.generate(torch.tensor([spec.input_ids]), max_new_tokens=sampling.max_tokens,
                                             pad_token_id=self.tokenizer.eos_token_id, **how) as tracer:
            saved = nnsight.save({"steps": []})
            for step in tracer.iter[:sampling.max_tokens]:
                out = lens_body(model, spec, site, step=step)
                saved["steps"].append(out)
                if sink is not None:
                    sink.readout(step, out)
            saved["result"] = tracer.result
        ids = saved["result"][0].tolist()[len(spec.input_ids):]
        self.steps += len(ids)
        return GenerationOutput(token_ids=ids, steps=list(saved["steps"])[:len(ids)])

    async def run_chat(self, spec: LensSpec, sampling: Sampling, sink=None) -> ChatOutput:
        """The chat readout as a plain traced generation (no edits, as on vLLM)."""
        spec.check_chat()
        name = spec.lenses[0]
        gen = await self.run_generate(spec, sampling, None if sink is None else ChatSteps(sink, name))
        return ChatOutput(token_ids=gen.token_ids,
                          top_ids=[s[name]["top_ids"][0, -1].tolist() for s in gen.steps],
                          top_probs=[s[name]["top_probs"][0, -1].tolist() for s in gen.steps])

    async def run_components(self, spec: ComponentsSpec) -> ComponentsOutput:
        """The components readout, with the attention on its eager path for this trace: the only one of
        transformers' paths that forms the weights (this backend runs one trace at a time)."""
        spec.check(self.info.n_layers)
        module = self.model._module
        was = module.config._attn_implementation
        module.set_attn_implementation("eager")
        try:
            saved = self._trace(spec.input_ids, components_trace, spec)
        finally:
            module.set_attn_implementation(was)
        return ComponentsOutput(**saved)

    def _trace(self, input_ids, body, *args) -> dict:
        """Trace `input_ids` running `body(model, site, *args)` (a `trace.*_trace` function); its dict."""
        import nnsight

        model, site = self.model, self.site
        with torch.no_grad(), model.trace(torch.tensor([input_ids])):
            saved = nnsight.save(body(model, site, *args))
        self.steps += 1
        return saved

    def failure(self) -> str | None:
        return None

    def progress(self) -> Progress:
        return Progress(self.steps)      # it runs on the engine's own thread: the watchdog waits for it anyway

    def is_dead(self, error: BaseException) -> str | None:
        return None              # an error here is the call's own: the model lives in this process

    def close(self) -> None:
        pass


def token_streamer(sink):
    """transformers' streamer writing the tokens generated so far into `sink` as each is sampled (its first call
    is the prompt, skipped)."""
    from transformers.generation.streamers import BaseStreamer

    class TokenStreamer(BaseStreamer):
        def __init__(self):
            self.ids: list[int] | None = None

        def put(self, value):
            if self.ids is None:
                self.ids = []
                return
            self.ids.extend(int(t) for t in value.reshape(-1))
            sink.tokens(self.ids)

        def end(self):
            pass

    return TokenStreamer()


class ChatSteps:
    """A chat's sink as `run_generate` writes into it: each step's readout of the one lens as (top ids, top probs)."""

    def __init__(self, sink, lens: str):
        self.sink, self.lens = sink, lens

    def readout(self, index: int, value) -> None:
        self.sink.readout(index, (value[self.lens]["top_ids"][0, -1], value[self.lens]["top_probs"][0, -1]))

    def tokens(self, token_ids) -> None:
        self.sink.tokens(token_ids)

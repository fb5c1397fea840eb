"""The model in HF transformers through nnsight's `TransformersModel`: no vLLM needed, and a backward pass.

The engine's fallback backend (a laptop without vLLM, macOS, a GPU where vLLM is not installed)
and the model the lens fitter differentiates. It runs the same trace bodies as vLLM, in this
process, one request at a time: its coroutines never await, so they hold the engine's thread for
their whole run. A multi-prompt batch would need padding, which shifts positions; one trace per
prompt keeps every position where the tokenizer put it.
"""

from __future__ import annotations

import torch

from .families import Family, find, hf_logits
from .protocol import ChatOutput, GenerationOutput, JStack, LensOutput, LensSpec, ModelInfo, Sampling
from .trace import continuation_body, lens_body


def load_transformers_model(path: str, *, device: str, dtype: torch.dtype):
    """nnsight's TransformersModel, loaded now, in eval mode (this backend and the lens fitter)."""
    from nnsight import TransformersModel

    model = TransformersModel(path, task="text-generation", device_map=device, dtype=dtype, dispatch=True)
    model._module.eval()
    return model


class TransformersBackend:
    concurrent = False           # one trace at a time, on the engine's thread

    def __init__(self, path: str, info: ModelInfo, family: Family, model=None):
        """`model`: an nnsight TransformersModel already built (a bench's random model); else loaded from `path`."""
        self.model = model or load_transformers_model(path, device=info.device, dtype=getattr(torch, info.dtype))
        self.info = info
        self.layout = family.layout("transformers")
        self.tokenizer = self.model.tokenizer
        self.jlens: dict | None = None

    def head(self, model, x):
        return hf_logits(model.config, find(model, self.layout.head)(x))

    async def install_jlens(self, stack: JStack) -> None:
        device = next(self.model._module.parameters()).device
        self.jlens = {"layers": list(stack.layers), "J": stack.J.to(device)}

    async def run_lens(self, spec: LensSpec) -> LensOutput:
        import nnsight

        model, d = self.model, self.info.d_model
        with torch.no_grad():
            with model.trace(torch.tensor([spec.input_ids])):
                res = lens_body(model, spec, self.layout, self.head, self.jlens, d)
                res["model_next_id"] = int(find(model, self.layout.head).output[0, -1].argmax())
                res = nnsight.save(res)
            conts = []
            for i, cont in enumerate(spec.continuations):
                with model.trace(torch.tensor([cont.input_ids])):
                    conts.append(nnsight.save(continuation_body(model, spec, self.layout, self.head, self.jlens, d, i)))
        next_id = int(res.pop("model_next_id"))
        return LensOutput(readouts=res, model_next_id=next_id, continuations=list(conts))

    async def run_generate(self, spec: LensSpec, sampling: Sampling) -> GenerationOutput:
        import nnsight

        model, d = self.model, self.info.d_model
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        how = ({"do_sample": False} if sampling.greedy
               else {"do_sample": True, "temperature": float(sampling.temperature)})
        with torch.no_grad(), model.generate(torch.tensor([spec.input_ids]), max_new_tokens=sampling.max_tokens,
                                             pad_token_id=self.tokenizer.eos_token_id, **how) as tracer:
            steps = nnsight.save([])
            for _ in tracer.iter[:sampling.max_tokens]:
                step = lens_body(model, spec, self.layout, self.head, self.jlens, d)
                step.pop("model_next_id")
                steps.append(step)
            out = nnsight.save(tracer.result)
        ids = out[0].tolist()[len(spec.input_ids):]
        return GenerationOutput(token_ids=ids, steps=list(steps)[:len(ids)])

    async def run_chat(self, spec: LensSpec, sampling: Sampling) -> ChatOutput:
        """The chat readout as a plain traced generation (no edits here)."""
        gen = await self.run_generate(spec, sampling)
        name = spec.lenses[0]
        return ChatOutput(token_ids=gen.token_ids,
                          top_ids=[s[name]["top_ids"][0, -1].tolist() for s in gen.steps],
                          top_probs=[s[name]["top_probs"][0, -1].tolist() for s in gen.steps])

    def failure(self) -> str | None:
        return None

    def is_dead(self, error: BaseException) -> str | None:
        return None              # an error here is the call's own: the model lives in this process

    def close(self) -> None:
        pass

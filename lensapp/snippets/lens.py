"""A lens tab's view as a script: each requested layer's top-k at the prompt's last position, as JSON.

Two forms, in the seeds' style: nnsight's `TransformersModel` (runs anywhere torch does; the form a
test runs against the app) and `VLLM(..., dispatch=True)` (the app's own engine). Both read each
layer's residual where the model's family keeps its blocks, apply the Jacobian lens's transport when
one is asked for, and unembed through the model's own final norm and head.
"""

from __future__ import annotations

from ..engine.run.families import Family
from . import bos_reader, traced

HEADER = '''# Lens Explorer: {what}
# pip install nnsight torch transformers{extra}
import json

import nnsight
import torch
{imports}
MODEL = {model!r}{model_note}
PROMPT = {prompt!r}
LAYERS = {layers!r}
K = {k}
'''

JLENS = '''# The Jacobian lens: J[layer] moves a layer's residual into the last layer's basis (h @ J.T).
J = torch.load({path!r}, map_location="cpu", weights_only=True)["J"]
'''


def lens_snippet(*, family: Family, model: str, prompt: str, layers: list[int], k: int, lens: str,
                 jlens: str | None = None, chat: bool = False, form: str = "transformers", model_note: str = "",
                 bos: bool = False) -> str:
    """A runnable script printing, for each layer, the lens's top-k at the prompt's last position as JSON
    ({lens: {layer: [[token, probability], ...]}}); the last line sets `readout` to the same dict. `bos`: the app
    reads with the tokenizer's BOS first (a Jacobian lens fitted so), and so does the script."""
    lenses = ("logit", "jacobian") if lens == "both" else (lens,)
    if "jacobian" in lenses and not jlens:
        raise ValueError("the Jacobian lens needs a lens file")
    layout = family.vllm_layout() if form == "vllm" else family.hf
    note = f"  # {model_note}" if model_note else ""
    if form == "vllm":
        imports = ("from nnsight.modeling.vllm import VLLM"
                   "   # on a CPU: from lensapp.engine.start.vllm_cpu import CPUVLLM\n")
        head = (HEADER.format(what="the view as vLLM runs it", extra=" vllm", imports=imports, model=model,
                              model_note=note, prompt=prompt, layers=layers, k=k))
    else:
        imports = "from nnsight import TransformersModel\n"
        head = HEADER.format(what="the view, on HF transformers", extra="", imports=imports, model=model,
                             model_note=note, prompt=prompt, layers=layers, k=k)
    body = [head]
    if "jacobian" in lenses:
        body.append(JLENS.format(path=jlens))
    body.append(_prompt_code(chat))
    residual = "sum(out)" if layout.pairs else "out[0] if isinstance(out, tuple) else out"
    transports = "".join(f'    "{name}": {transport},\n' for name, transport in
                         (("logit", "lambda layer, h: h"),
                          ("jacobian", "lambda layer, h: h @ J[layer].to(h.dtype).T if layer in J else h"))
                         if name in lenses)
    body.append(f"LENSES = {{\n{transports}}}\n")
    if form == "vllm":
        body.append(_vllm_code(layout, residual, bos))
    else:
        body.append(_hf_code(layout, residual, bos))
    body.append('''readout = {name: {layer: [[model.tokenizer.decode([int(i)]), round(float(p), 4)]
                         for p, i in zip(*tops[name][n])] for n, layer in enumerate(LAYERS)} for name in LENSES}
print(json.dumps(readout, ensure_ascii=False, indent=1))
''')
    return "\n".join(body)


def _prompt_code(chat: bool) -> str:
    if not chat:
        return "INPUT = PROMPT\n"
    return ("# The prompt wrapped in the model's chat template, as the app's chat option does.\n"
            "INPUT = None  # set below, once the tokenizer is loaded\n")


def _hf_code(layout, residual: str, bos: bool) -> str:
    return f'''model = TransformersModel(MODEL, task="text-generation", dispatch=True)
if INPUT is None:
    INPUT = model.tokenizer.apply_chat_template([{{"role": "user", "content": PROMPT}}], add_generation_prompt=True,
                                                tokenize=False)
{bos_reader(bos)}with torch.no_grad(), model.trace({traced("INPUT", bos)}):
    saved = []
    for layer in LAYERS:
        out = model.{layout.blocks}[layer].output      # the residual stream after block `layer`
        saved.append({residual})
    saved = nnsight.save(saved)

norm, head, config = model.{layout.norm}._module, model.{layout.head}._module, model.config
cap = getattr(config, "final_logit_softcapping", None)           # the family's logit arithmetic (Gemma, ...)
scale = getattr(config, "logit_scale", 1.0) / getattr(config, "logits_scaling", 1.0)
tops = {{}}
with torch.no_grad():
    for name, transport in LENSES.items():
        tops[name] = []
        for layer, h in zip(LAYERS, saved):
            logits = head(norm(transport(layer, h[0, -1:]))).float()    # the last position: what comes next
            logits = (torch.tanh(logits / cap) * cap if cap else logits) * scale
            top = logits.softmax(-1)[0].topk(K)
            tops[name].append((top.values, top.indices))
'''


def _vllm_code(layout, residual: str, bos: bool) -> str:
    return f'''model = VLLM(MODEL, dispatch=True, enable_prefix_caching=False)
if INPUT is None:
    INPUT = model.tokenizer.apply_chat_template([{{"role": "user", "content": PROMPT}}], add_generation_prompt=True,
                                                tokenize=False)
{bos_reader(bos, as_tensor=False)}with model.trace({traced("INPUT", bos)}, temperature=0.0, max_tokens=1):
    tops = {{name: [] for name in LENSES}}
    for layer in LAYERS:
        out = model.{layout.blocks}[layer].output
        h = {residual}   # the residual stream after block `layer`{" (vLLM: hidden + residual)" if layout.pairs else ""}
        for name, transport in LENSES.items():
            logits = model.logits_processor(model.{layout.head}, model.{layout.norm}(transport(layer, h[-1:])))
            top = logits.float().softmax(-1)[0].topk(K)
            tops[name].append((top.values, top.indices))
    tops = nnsight.save(tops)
'''

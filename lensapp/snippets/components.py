"""The components view as a script: who wrote a logit at one position (the embedding, each attention layer
and head, each MLP), and a layer's attention weights, from nnsight's `TransformersModel` with eager
attention.

The parts are read where the family's anatomy keeps them (`engine.run.anatomy`: the attention's output
projection, a norm after the attention, the MLP) and scored through the final norm frozen at the actual
final residual, the rule of `lensapp.attribution`, which the app's own readout follows.
"""

from __future__ import annotations

from ..engine.run.families import Family
from . import rules, settings

COMPONENTS = '''# Lens Explorer: who wrote {what} at position {position}, on HF transformers
# pip install nnsight torch transformers
from __future__ import annotations

import json
import unicodedata

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
{settings}

{rules}
# Eager attention: the one path of transformers that forms the attention weights.
model = TransformersModel(MODEL, task="text-generation", dispatch=True, attn_implementation="eager")
IDS = prompt_ids(model.tokenizer, PROMPT, CHAT, BOS)          # the prompt's token ids, as the app read them
blocks = model.{blocks}
with torch.no_grad(), model.trace(torch.tensor([IDS])):
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
    """The first token of `word` as the app reads it after the prompt's tokens up to POSITION (word_ids)."""
    return word_ids(model.tokenizer, context_of(model.tokenizer, IDS[:POSITION + 1]), word)[0]


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
                       model_note: str = "", bos: bool = False) -> str:
    """A runnable script printing the components readout of the view ({logit, parts, sum, patterns}, as the CLI's
    JSON) from nnsight's TransformersModel with eager attention; the last lines set `components` to it. It reads
    the prompt and the words as the app did (`chat`: in the chat template; `bos`: the tokenizer's BOS first, which
    is then position 0) with the app's own rule (`rules`); `position` counts from 0."""
    layout = family.hf
    what = f"logit({target!r})" + (f" - logit({foil!r})" if foil else "")
    attn_part = f"block.{anatomy.attn_norm}.output" if anatomy.attn_norm else "attn[0]"
    post_code = (f"frozen(blocks[layer].{anatomy.attn_norm}._module, s[\"raw\"])   # the norm after the attention"
                 if anatomy.attn_norm else "lambda c: c")
    return COMPONENTS.format(what=what, position=position, model=model,
                             model_note=f"  # {model_note}" if model_note else "", prompt=prompt, target=target,
                             foil=foil or None, patterns=patterns, head_dim=head_dim, plus_one=family.norm_plus_one,
                             blocks=layout.blocks, o_proj=anatomy.o_proj, attn=anatomy.attn, attn_part=attn_part,
                             mlp_part=anatomy.mlp_part, norm=layout.norm, head=layout.head, post_code=post_code,
                             settings=settings(chat, bos), rules=rules(words=True))

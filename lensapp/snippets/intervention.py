"""An intervention's view as a script: the same change (a steer, an ablation or a patch) made on nnsight's
`TransformersModel`, printing the word's probability at the output before and after each change.

Reads what the intervention says was done (`results.InterventionDone`: layers, positions, direction,
alphas, the typical norms it measured); a fitted steering vector is not reproduced (it names the fitter).
"""

from __future__ import annotations

from ..engine.run.families import Family
from ..results import AblateDone, InterventionDone, PatchDone, SteerDone
from . import lens_file, rules, settings

INTERVENE = '''# Lens Explorer: an intervention ({kind}), on HF transformers
# pip install nnsight torch transformers
from __future__ import annotations

import unicodedata

import nnsight
import torch
from nnsight import TransformersModel

MODEL = {model!r}{model_note}
PROMPT = {prompt!r}
LAYERS = {layers!r}                # the layers whose output is changed
POSITIONS = {positions!r}          # the prompt positions changed (None: all)
WORD = {word!r}
{settings}

{rules}
model = TransformersModel(MODEL, task="text-generation", dispatch=True)
blocks, norm, head = model.{blocks}, model.{norm}._module, model.{head}._module
IDS = prompt_ids(model.tokenizer, PROMPT, CHAT, BOS)          # the prompt's token ids, as the app read them


def token(word):
    """The first token of `word` as the app reads it after the prompt (word_ids)."""
    return word_ids(model.tokenizer, context_of(model.tokenizer, IDS), word)[0]


target = token(WORD)


def stream(out):
    """A block's output -> the residual stream it passes on, [positions, d_model] (a view: edits stick)."""
    return (out[0] if isinstance(out, tuple) else out)[0]


def p_word(edit=None, ids=IDS):
    """P(WORD) at the last position of the model's output, with `edit(layer, h)` changing h in place."""
    with torch.no_grad(), model.trace(torch.tensor([ids])):
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
SOURCE_IDS = prompt_ids(model.tokenizer, SOURCE, CHAT, BOS)    # read as the prompt is
with torch.no_grad(), model.trace(torch.tensor([SOURCE_IDS])):
    saved = nnsight.save({{layer: stream(blocks[layer].output)[SOURCE_POSITIONS] for layer in LAYERS}})
for patched in LAYERS:                             # one layer at a time, as the app's sweep
    def patch(layer, h):
        if layer == patched:
            h[list(POSITIONS)] = saved[layer].to(h.dtype)
    print(f"patched at layer {{patched}}:", p_word(patch))
'''


def intervention_snippet(*, family: Family, model: str, prompt: str, intervention: InterventionDone,
                         jlens: str | None = None, model_note: str = "", bos: bool = False,
                         chat: bool = False) -> str:
    """A runnable script that makes the same change (what `intervention` says was done) on nnsight's
    TransformersModel and prints the word's probability at the output before and after each change ("" for a
    kind it has no script for). It reads the prompts and words as the app did (`chat`: in the chat template;
    `bos`: the tokenizer's BOS first) with the app's own rule (`rules`)."""
    layout = family.hf
    done = intervention
    if not isinstance(done, (SteerDone, AblateDone, PatchDone)):
        return ""
    body = [INTERVENE.format(kind=done.kind, model=model, model_note=f"  # {model_note}" if model_note else "",
                             prompt=prompt, layers=list(done.layers),
                             positions=None if done.changed_positions is None else list(done.changed_positions),
                             word=done.word or "", blocks=layout.blocks, norm=layout.norm, head=layout.head,
                             settings=settings(chat, bos), rules=rules(words=True))]
    if isinstance(done, PatchDone):
        body.append(PATCH.format(source=done.source, sources=list(done.source_positions)))
        return "\n".join(body)
    jacobian = done.direction == "jacobian"
    if jacobian and not jlens:
        raise ValueError("a Jacobian-lens direction needs the lens file")
    from_line = (f"w = w - head.weight[token({done.from_word!r})].float() * norm.weight.float()   # from that word "
                 "to WORD\n" if done.from_word else "")
    body.append(DIRECTION.format(from_line=from_line, jacobian=(
        "# The Jacobian lens: a word's direction at a layer is J_l^T w.\n" + lens_file(jlens) +
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

"""The road not taken: a generation with a token forced at one step, grafted onto the one it branches from.

A branch at step s with token t keeps its parent's first s tokens and their readouts as they are (the
positions that produced them are the same), puts t at step s (the readout there is the parent's: the
position that produced it did not change, only the choice made from it), and continues with what the
model generated from prompt + parent[:s] + t as a request of its own (same settings and seed): only that
continuation is computed. A branch of a branch is the same again on the branch (its `forced` grows).

Then, side by side: where two generations part (the first step whose token differs) and, at each later step,
which layers read a different top-1 (the layers that changed their mind).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from . import decided as decisions
from .generation import ChatReply, GenerationResult, GenerationStep
from .lens import LensResult
from .readout import Decode, in_context


def graft(parent: GenerationResult, step: int, token_id: int, continuation: GenerationResult | None, *,
          prompt_ids: list[int], decode: Decode, text: str) -> GenerationResult:
    """parent's first `step` steps, `token_id` at `step` (read where the parent read its own token there), then
    `continuation` (generated from prompt + parent[:step] + token, its step 0 reading only that token's
    position, or None when nothing follows: the last step, an end-of-text token)."""
    if not 0 <= step < len(parent.token_ids):
        raise ValueError(f"step {step} is outside the generation's {len(parent.token_ids)} tokens")
    after = continuation.steps if continuation is not None else []
    ids = parent.token_ids[:step] + [int(token_id)] + (continuation.token_ids if continuation is not None else [])
    shown = in_context(decode, list(prompt_ids) + ids)[len(prompt_ids):]
    steps = [dataclasses.replace(s, token=shown[i]) for i, s in enumerate(parent.steps[:step])]
    at = parent.steps[step]
    steps.append(GenerationStep(token_id=int(token_id), token=shown[step], newest_top=at.newest_top,
                                readout=forced_readout(at.readout, int(token_id), decode, at.newest_top)))
    steps += [dataclasses.replace(s, token=shown[step + 1 + i]) for i, s in enumerate(after)]
    return dataclasses.replace(parent, text=text, token_ids=ids, tokens=shown, steps=steps,
                               forced=list(parent.forced) + [(step, int(token_id))])


def forced_readout(readout: LensResult, token_id: int, decode: Decode,
                   newest_top: dict[str, tuple[np.ndarray, np.ndarray]] | None = None) -> LensResult:
    """A step's readout with `token_id` as the token chosen from its newest position: its strip is about it now.
    With `newest_top` (the step's top tokens there before the cut to k: `GenerationStep`), every rule the step
    had is decided again for the forced token, whatever k; without it, from the readout's own top-k."""
    lenses = {}
    for name, r in readout.lenses.items():
        ids = (r.decided_ids if r.decided_ids is not None else r.top_ids[-1, :, 0]).copy()
        ids[-1] = token_id
        tokens = list(r.decided_tokens) if r.decided_tokens is not None else decode([int(i) for i in ids])
        tokens[-1] = decode([token_id])[0]
        decided = None
        if newest_top is not None and name in newest_top:
            top_ids, top_probs = newest_top[name]
            decided = {}
            for rule, rows in r.decisions().items():
                if rule == "top5" and top_ids.shape[-1] < decisions.WIDTH:
                    continue
                rows = rows.copy()
                rows[-1] = decisions.decided_rows(top_ids[:, None], top_probs[:, None], np.array([token_id]), rule)[0]
                decided[rule] = rows
        lenses[name] = dataclasses.replace(r, decided_ids=ids, decided_tokens=tokens, decided=decided)
    return dataclasses.replace(readout, lenses=lenses, model_next_id=token_id, model_next_token=decode([token_id])[0])


def graft_chat(parent: ChatReply, step: int, token_id: int, continuation: ChatReply | None, *, decode: Decode,
               text: str) -> ChatReply:
    """`graft` for a chat reply: its per-token readout kept up to `step`, then the continuation's."""
    if not 0 <= step < len(parent.token_ids):
        raise ValueError(f"step {step} is outside the reply's {len(parent.token_ids)} tokens")
    ids = parent.token_ids[:step] + [int(token_id)] + (continuation.token_ids if continuation is not None else [])
    more = continuation if continuation is not None else dataclasses.replace(parent, readout=[], top_ids=[])
    return dataclasses.replace(parent, text=text, token_ids=ids, tokens=in_context(decode, ids),
                               readout=parent.readout[:step + 1] + more.readout,
                               top_ids=parent.top_ids[:step + 1] + more.top_ids,
                               forced=list(parent.forced) + [(step, int(token_id))])


def parting(a: GenerationResult | ChatReply, b: GenerationResult | ChatReply) -> int | None:
    """The first step whose token differs between a and b (or where one ends first); None: the same tokens."""
    for step, (x, y) in enumerate(zip(a.token_ids, b.token_ids)):
        if x != y:
            return step
    return None if len(a.token_ids) == len(b.token_ids) else min(len(a.token_ids), len(b.token_ids))


def changed_layers(a: GenerationResult, b: GenerationResult, lens: str = "logit") -> list[dict]:
    """Per step from where a and b part, while both have one: its tokens, and the layers whose top-1 at the
    newest position differs between them ({"step", "tokens": [a's, b's], "layers": [...]})."""
    start = parting(a, b)
    if start is None:
        return []
    out = []
    for step in range(start, min(len(a.steps), len(b.steps))):
        ra, rb = a.steps[step].readout, b.steps[step].readout
        top_a, top_b = ra.lenses[lens].top_ids[:, -1, 0], rb.lenses[lens].top_ids[:, -1, 0]
        differ = np.flatnonzero(top_a != top_b)
        out.append({"step": step, "tokens": [a.tokens[step], b.tokens[step]],
                    "layers": [int(ra.layers[i]) for i in differ]})
    return out

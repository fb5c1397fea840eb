"""Where each token was decided: the first layer from which a lens reads it, and keeps reading it, to the last.

For a position p and a token t (a lens readout's final top-1, or the token a generation produced there),
read through the layers of a readout from the deepest down:

    decided(p) = the shallowest row r such that t "holds" at every row r, r + 1, ..., L - 1

and None where t does not hold at the last row (it never settles). Three meanings of "holds" (`RULES`):

    top1   t is the lens's top-1 (ties count in t's favour: a probability equal to the top-1's)
    top5   t is among the lens's top 5 (needs k >= 5 read)
    p50    the lens gives t a probability above 0.5 (then it is also its top-1)

Pure numpy on a readout's top-k arrays, [L, P, k] (rows: the layers read, in increasing order), so a strip
costs nothing on the engine: every rule is decided from the top-k the readout already holds. A token
outside the top-k at a row does not hold there under any rule (for p50: a token that is not the top-1 has
p <= 0.5, since p(t) <= p(top-1) and p(t) + p(top-1) <= 1).
"""

from __future__ import annotations

import numpy as np

RULES = ("top1", "top5", "p50")
RULE_TITLES = {"top1": "top-1", "top5": "in the top 5", "p50": "p > 0.5"}
WIDTH = 5                       # the top-k a readout needs for every rule (top5)
NEVER = -1                      # decided_rows' value where the token never settles


def holds(top_ids: np.ndarray, top_probs: np.ndarray, tokens: np.ndarray, rule: str) -> np.ndarray:
    """top_ids, top_probs [L, P, k], tokens [P] -> bool [L, P]: whether each cell reads `tokens` under `rule`."""
    if rule not in RULES:
        raise ValueError(f"unknown decision rule {rule!r}; one of {RULES}")
    if top_ids.shape != top_probs.shape or top_ids.ndim != 3:
        raise ValueError(f"top_ids {top_ids.shape} and top_probs {top_probs.shape} must both be [L, P, k]")
    if tokens.shape != top_ids.shape[1:2]:
        raise ValueError(f"tokens {tokens.shape} do not match {top_ids.shape[1]} positions")
    if rule == "top5" and top_ids.shape[-1] < WIDTH:
        raise ValueError(f"the top-5 rule needs k >= {WIDTH}; the readout holds the top {top_ids.shape[-1]}")
    match = top_ids == tokens[None, :, None]                                      # [L, P, k]
    if rule == "top5":
        return match[..., :WIDTH].any(-1)
    # top-1, ties in its favour: its probability reaches the top-1's
    p = np.where(match, top_probs, -1.0).max(-1)                                # [L, P], -1: not in the top-k
    top1 = match.any(-1) & (p >= top_probs[..., 0])
    return top1 & (p > 0.5) if rule == "p50" else top1


def decided_rows(top_ids: np.ndarray, top_probs: np.ndarray, tokens: np.ndarray, rule: str = "top1") -> np.ndarray:
    """[P] int: the first row from which `tokens` holds under `rule` at every later row; NEVER where it does
    not hold at the last row."""
    ok = holds(np.asarray(top_ids), np.asarray(top_probs), np.asarray(tokens), rule)
    L = ok.shape[0]
    if L == 0:
        return np.full(ok.shape[1], NEVER, dtype=np.int64)
    # run of True rows ending at the last: its length, counted from the top down
    settled = np.cumprod(ok[::-1], axis=0)[::-1]                                # [L, P]: holds from here up
    run = settled.sum(0)
    return np.where(run > 0, L - run, NEVER).astype(np.int64)


def as_layers(rows: np.ndarray, layers: list[int]) -> list[int | None]:
    """Rows -> the model layers they are (None where NEVER): what the JSON carries."""
    return [None if r == NEVER else int(layers[r]) for r in np.asarray(rows).tolist()]


def summary(decided: list[int | None], tokens: list[str], latest: int = 3) -> dict:
    """A prompt's decisions in a few numbers: how many settled, their mean layer, and the latest-decided tokens
    (position, token, layer; the deepest first, ties by position)."""
    settled = [(layer, pos) for pos, layer in enumerate(decided) if layer is not None]
    last = sorted(settled, key=lambda lp: (-lp[0], lp[1]))[:latest]
    return {"decided": len(settled), "undecided": len(decided) - len(settled),
            "mean_layer": round(float(np.mean([layer for layer, _ in settled])), 2) if settled else None,
            "latest": [{"position": pos, "token": tokens[pos], "layer": layer} for layer, pos in last]}

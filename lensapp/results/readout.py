"""One lens's readout of one prompt, and the targets it scores: the parts a `LensResult` is made of.

`from_readout` is the only code here that touches tensors (the engine's `Readout`): tokens are decoded
and numbers rounded at this boundary, and each position's decision (`decided.py`) read from the worker's
top-k before it is cut to k. Knows nothing of the prompt's text, the layers' numbers or the other lenses: the
result's (`lens.py`).

Shapes: L = requested layers, P = positions, k = top-k, n = targets.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import numpy as np

from . import decided as decisions
from .export import round_floats
from .punctuation import pick_display

if TYPE_CHECKING:
    from ..engine.run.protocol import Readout

Decode = Callable[[list[int]], list[str]]


def in_context(decode: Decode, ids: list[int]) -> list[str]:
    """One sequence's tokens as display text: with `decode`'s `sequence` where it has one (characters split over
    tokens joined: service/tokens.py), else token by token."""
    return getattr(decode, "sequence", decode)(list(ids))


def bare_first(tokens: list[str]) -> bool:
    """Whether a word's first token is only whitespace (" 19" is ␣, 1, 9 to SmolLM2's and Qwen's tokenizers): its
    probability is the space's, which cannot mean the word, so the word is read whole (`TargetScore.as_read`)."""
    return len(tokens) > 1 and not tokens[0].strip()


@dataclass(frozen=True)
class Target:
    """A target word as it is scored: its text, and its tokens as they would follow the prompt."""

    text: str
    token_ids: tuple[int, ...]


@dataclass
class TargetScore:
    """One target string's score under one lens.

    probs, ranks  [L, P]: probability and rank (1 = top) of the target's FIRST token.
    continuation_logprob [L] | None: log-probability of the whole multi-token target as the
        continuation of the prompt, read at the last position and the target's own following
        positions (None for a single-token target, where probs[:, -1] is the same thing, and
        for one of more than MAX_CONTINUATION_TOKENS tokens).
    """

    text: str
    token_ids: list[int]
    tokens: list[str]
    probs: np.ndarray
    ranks: np.ndarray
    continuation_logprob: np.ndarray | None = None

    @property
    def scored_as(self) -> str:
        if len(self.token_ids) == 1:
            return "single token"
        if bare_first(self.tokens):
            return ("whole word at the last position (its first token is only whitespace)"
                    if self.continuation_logprob is not None else "not read: its first token is only whitespace")
        if self.continuation_logprob is None:
            return "first token only (too many tokens to score the whole continuation)"
        return "first token per position; whole continuation at the last position"

    def as_read(self) -> tuple[np.ndarray, np.ndarray]:
        """probs, ranks [L, P] of the word as the charts show it: its first token's, except where that is only
        whitespace (`bare_first`): then the whole word's probability at the last position, nothing elsewhere
        (NaN) and no rank (0), since no single token there is the word."""
        if not bare_first(self.tokens):
            return self.probs, self.ranks
        probs = np.full(self.probs.shape, np.nan, dtype=np.float32)
        if self.continuation_logprob is not None:
            probs[:, -1] = np.exp(self.continuation_logprob)
        return probs, np.zeros_like(self.ranks)

    def to_json(self) -> dict:
        out = {
            "text": self.text, "token_ids": self.token_ids, "tokens": self.tokens, "scored_as": self.scored_as,
            "prob": round_floats(self.probs), "rank": self.ranks.astype(int).tolist(),
        }
        if self.continuation_logprob is not None:
            out["continuation_prob"] = round_floats(np.exp(self.continuation_logprob))
        return out


@dataclass
class LensReadout:
    """One lens over the requested layers and positions.

    top_ids [L, P, k] int, top_probs [L, P, k] float32, top_tokens [L][P][k] str,
    entropy [L, P] nats, kl_to_final [L, P] nats = KL(model's final distribution || lens).
    display_tokens [L][P], display_ranks [L, P], display_probs [L, P]: with skip_punctuation, the
        token each cell shows (the best of the `searched` tokens that is not punctuation), its rank
        (1 = top; 0: none found, the cell shows its top-1) and probability; None otherwise.
    decided_ids [P], decided_tokens [P]: the token whose decision each position's strip shows (the model's
        final top-1 there, or the token a generation produced); decided {rule: rows [P]}: the first row from
        which it holds to the last (`decided.py`; NEVER: it does not). Read from the worker's top-k before
        it is cut to k; None: made from this readout's own top-k when asked (`decisions`).
    """

    top_ids: np.ndarray
    top_probs: np.ndarray
    top_tokens: list[list[list[str]]]
    entropy: np.ndarray
    kl_to_final: np.ndarray
    targets: list[TargetScore] = field(default_factory=list)
    display_tokens: list[list[str]] | None = None
    display_ranks: np.ndarray | None = None
    display_probs: np.ndarray | None = None
    searched: int = 0
    decided_ids: np.ndarray | None = None
    decided_tokens: list[str] | None = None
    decided: dict[str, np.ndarray] | None = None

    def __post_init__(self):
        L, P, k = self.top_ids.shape
        if self.top_probs.shape != (L, P, k) or self.entropy.shape != (L, P) or self.kl_to_final.shape != (L, P):
            raise ValueError(f"inconsistent readout shapes: ids {self.top_ids.shape}, probs {self.top_probs.shape}, "
                             f"entropy {self.entropy.shape}, kl {self.kl_to_final.shape}")
        if self.display_ranks is not None and self.display_ranks.shape != (L, P):
            raise ValueError(f"display ranks {self.display_ranks.shape} != (layers {L}, positions {P})")

    @classmethod
    def from_readout(cls, raw: Readout, decode: Decode, targets: list[Target] = (),
                     continuations: list = (), k: int | None = None, skip_punctuation: bool = False,
                     next_ids: dict[int, int] | None = None) -> LensReadout:
        """raw: `lenses.layer_readouts` tensors ([L, P, ...]); continuations[j]: target j's whole-word
        log-probability per layer [L], or None where it is scored by its first token. k: the top-k kept
        (the worker may have read more, to find words for skip_punctuation and the top-5 decision: they
        pick the display and the decisions only). next_ids {position: token id}: positions whose decision
        is about that token (what a generation produced there) rather than the final top-1."""
        ids = raw["top_ids"].cpu().numpy().astype(np.int64)
        probs = raw["top_probs"].float().cpu().numpy()
        decided = _decisions(raw, ids, probs, next_ids or {})
        scores = []
        for j, target in enumerate(targets):
            cont = continuations[j] if j < len(continuations) else None
            scores.append(TargetScore(
                text=target.text, token_ids=list(target.token_ids), tokens=in_context(decode, target.token_ids),
                probs=raw["target_probs"][..., j].float().cpu().numpy(),
                ranks=raw["target_ranks"][..., j].cpu().numpy().astype(np.int64),
                continuation_logprob=None if cont is None else cont.float().cpu().numpy(),
            ))
        vocab_cache: dict[int, str] = {}
        flat = [int(i) for i in ids.reshape(-1)]
        for i in set(flat) | set(decided["decided_ids"].tolist()):
            vocab_cache[i] = decode([i])[0]
        decided["decided_tokens"] = [vocab_cache[int(i)] for i in decided["decided_ids"]]
        tokens = [[[vocab_cache[int(i)] for i in pos] for pos in layer] for layer in ids]
        display = {}
        if skip_punctuation:
            shown, ranks = pick_display(tokens, probs)
            picked = np.take_along_axis(probs, np.maximum(ranks - 1, 0)[..., None], axis=-1)[..., 0]
            display = {"display_tokens": shown, "display_ranks": ranks, "display_probs": picked,
                       "searched": ids.shape[-1]}
        k = ids.shape[-1] if k is None else min(k, ids.shape[-1])
        return cls(
            top_ids=ids[..., :k], top_probs=probs[..., :k], top_tokens=[[pos[:k] for pos in layer] for layer in tokens],
            entropy=raw["entropy"].float().cpu().numpy(), kl_to_final=raw["kl_to_final"].float().cpu().numpy(),
            targets=scores, **display, **decided,
        )

    def decisions(self) -> dict[str, np.ndarray]:
        """{rule: rows [P]} (`decided.py`): as read from the worker's top-k, or from this readout's own (the
        top-5 rule only where it holds five); about `decided_ids`, or the last row's top-1."""
        if self.decided is not None:
            return self.decided
        tokens = self.decided_ids if self.decided_ids is not None else self.top_ids[-1, :, 0]
        return {rule: decisions.decided_rows(self.top_ids, self.top_probs, tokens, rule) for rule in decisions.RULES
                if rule != "top5" or self.top_ids.shape[-1] >= decisions.WIDTH}

    def padded(self, before: int) -> LensReadout:
        """This readout with `before` blank positions in front (a readout from position `before` on, made the
        shape of the whole prompt's): ids -1, tokens "", numbers NaN, ranks 0, decisions NEVER."""
        if before <= 0:
            return self

        def pad(a: np.ndarray | None, fill) -> np.ndarray | None:
            if a is None:
                return None
            axis = min(a.ndim - 1, 1)                       # [P] or [L, P, ...]
            shape = list(a.shape)
            shape[axis] = before
            return np.concatenate([np.full(shape, fill, dtype=a.dtype), a], axis=axis)

        def pad_lists(rows: list | None, blank) -> list | None:
            return None if rows is None else [[blank] * before + list(row) for row in rows]

        k = self.top_ids.shape[-1]
        return dataclasses.replace(
            self, top_ids=pad(self.top_ids, -1), top_probs=pad(self.top_probs, np.nan),
            top_tokens=pad_lists(self.top_tokens, [""] * k), entropy=pad(self.entropy, np.nan),
            kl_to_final=pad(self.kl_to_final, np.nan),
            targets=[dataclasses.replace(t, probs=pad(t.probs, np.nan), ranks=pad(t.ranks, 0)) for t in self.targets],
            display_tokens=pad_lists(self.display_tokens, ""), display_ranks=pad(self.display_ranks, 0),
            display_probs=pad(self.display_probs, np.nan), decided_ids=pad(self.decided_ids, -1),
            decided_tokens=None if self.decided_tokens is None else [""] * before + list(self.decided_tokens),
            decided=None if self.decided is None else {rule: pad(rows, decisions.NEVER)
                                                       for rule, rows in self.decided.items()})

    def to_json(self) -> dict:
        return {
            "top_tokens": self.top_tokens, "top_ids": self.top_ids.tolist(), "top_probs": round_floats(self.top_probs),
            "entropy": round_floats(self.entropy), "kl_to_final": round_floats(self.kl_to_final),
            "targets": [t.to_json() for t in self.targets],
            **self.display_json(),
        }

    def display_json(self) -> dict:
        """With skip_punctuation: the token each cell shows and its rank (0: none in the `searched` top tokens)."""
        if self.display_ranks is None:
            return {}
        return {"display_tokens": self.display_tokens, "display_ranks": self.display_ranks.astype(int).tolist(),
                "display_probs": round_floats(self.display_probs), "display_searched": self.searched}


def _decisions(raw: Readout, ids: np.ndarray, probs: np.ndarray, next_ids: dict[int, int]) -> dict:
    """The decided_* fields of a readout: the token each position is about (the engine's final top-1, or the
    last row's top-1 where the readout has none, then `next_ids`), and each rule's rows."""
    final = raw.get("final_top_id")
    tokens = final[0].cpu().numpy().astype(np.int64) if final is not None else ids[-1, :, 0].copy()
    for pos, token in next_ids.items():
        tokens[pos] = token
    rules = [r for r in decisions.RULES if r != "top5" or ids.shape[-1] >= decisions.WIDTH]
    return {"decided_ids": tokens, "decided": {r: decisions.decided_rows(ids, probs, tokens, r) for r in rules}}

"""One prompt's readout: every requested lens at every requested layer and position.

`from_*` classmethods are the only code here that touches tensors (the engine's outputs); tokens
are decoded and numbers rounded at this boundary, never inside a trace. Everything is a plain numpy
array or list afterwards, so results pickle, compare and serialise cheaply.

Shapes: L = requested layers, P = positions, k = top-k, n = targets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import pandas as pd

from . import decided as decisions
from .export import dumps, round_floats
from .punctuation import pick_display

if TYPE_CHECKING:
    from ..engine.run.protocol import LensOutput, Readout

Decode = Callable[[list[int]], list[str]]


def in_context(decode: Decode, ids: list[int]) -> list[str]:
    """One sequence's tokens as display text: with `decode`'s `sequence` where it has one (characters split over
    tokens joined: service/tokens.py), else token by token."""
    return getattr(decode, "sequence", decode)(list(ids))


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
        if self.continuation_logprob is None:
            return "first token only (too many tokens to score the whole continuation)"
        return "first token per position; whole continuation at the last position"

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


@dataclass
class LensResult:
    """All requested lenses for one prompt. `layers[i]` is the model layer of row i of every array.

    after_attention: with sublayers, the logit lens at each layer's residual after its attention and before
    its MLP (rows `L.attn`; the usual rows are after the MLP, `L.mlp`), at the same layers and positions.
    """

    prompt: str
    input_ids: list[int]
    input_tokens: list[str]
    layers: list[int]
    lenses: dict[str, LensReadout]
    model_next_id: int
    model_next_token: str
    model: str = ""
    jlens: dict | None = None
    after_attention: dict[str, LensReadout] | None = None

    def __post_init__(self):
        for name, r in {**self.lenses, **{f"{k} after attention": v for k, v in (self.after_attention or {}).items()}
                        }.items():
            if r.top_ids.shape[:2] != (len(self.layers), len(self.input_ids)):
                raise ValueError(f"lens {name}: {r.top_ids.shape[:2]} != (layers {len(self.layers)}, "
                                 f"positions {len(self.input_ids)})")

    @classmethod
    def from_output(cls, output: LensOutput, *, prompt: str, ids: list[int], layers: list[int], decode: Decode,
                    targets: list[Target] = (), continuation_of: list[int | None] = (),
                    model: str = "", jlens: dict | None = None, k: int | None = None,
                    skip_punctuation: bool = False) -> LensResult:
        """One prompt's engine output -> a result. continuation_of[j]: index of target j's continuation
        in output.continuations (None: scored by its first token only)."""
        lenses = {}
        for name, raw in output.readouts.items():
            conts = [None if c is None else output.continuations[c][name] for c in continuation_of]
            lenses[name] = LensReadout.from_readout(raw, decode, targets, conts, k, skip_punctuation)
        between = None
        if output.after_attention is not None:          # no continuations there: targets by their first token
            between = {name: LensReadout.from_readout(raw, decode, targets, [], k, skip_punctuation)
                       for name, raw in output.after_attention.items()}
        return cls(prompt=prompt, input_ids=list(ids), input_tokens=in_context(decode, ids), layers=list(layers),
                   lenses=lenses,
                   model_next_id=output.model_next_id, model_next_token=decode([output.model_next_id])[0],
                   model=model, jlens=jlens if "jacobian" in lenses else None, after_attention=between)

    # -- derived views -------------------------------------------------------------
    def top1_grid(self, lens: str = "logit") -> pd.DataFrame:
        """Top-1 token per layer (rows) x position (columns)."""
        r = self.lenses[lens]
        return pd.DataFrame([[pos[0] for pos in layer] for layer in r.top_tokens],
                            index=self.layers, columns=range(len(self.input_ids)))

    def display_grid(self, lens: str = "logit") -> pd.DataFrame:
        """With skip_punctuation: each cell's shown token as repr, '#r' after it where it is rank r > 1."""
        r = self.lenses[lens]
        if r.display_ranks is None:
            raise ValueError("this result was read without skip_punctuation")
        cells = [[repr(tok) + ("" if rank == 1 else " (none)" if rank == 0 else f" #{rank}")
                  for tok, rank in zip(layer, ranks)] for layer, ranks in zip(r.display_tokens, r.display_ranks)]
        return pd.DataFrame(cells, index=self.layers, columns=range(len(self.input_ids)))

    def top_k_table(self, lens: str = "logit", position: int = -1) -> pd.DataFrame:
        """Top-k at one position, a row per layer: layer, rank-1 token, p, rank-2 token, p, ..."""
        r = self.lenses[lens]
        pos = position % len(self.input_ids)
        rows = []
        for i, layer in enumerate(self.layers):
            row: dict[str, Any] = {"layer": layer}
            for j, (tok, p) in enumerate(zip(r.top_tokens[i][pos], r.top_probs[i, pos])):
                row[f"#{j + 1}"] = tok
                row[f"p{j + 1}"] = round(float(p), 4)
            row["entropy"] = round(float(r.entropy[i, pos]), 3)
            row["KL to final"] = round(float(r.kl_to_final[i, pos]), 3)
            rows.append(row)
        return pd.DataFrame(rows)

    def long_frame(self) -> pd.DataFrame:
        """One row per lens x layer x position x rank: the CSV export."""
        rows = []
        for name, r in self.lenses.items():
            for i, layer in enumerate(self.layers):
                for pos in range(len(self.input_ids)):
                    for j in range(r.top_ids.shape[-1]):
                        rows.append((name, layer, pos, self.input_tokens[pos], j + 1, int(r.top_ids[i, pos, j]),
                                     r.top_tokens[i][pos][j], float(r.top_probs[i, pos, j]),
                                     float(r.entropy[i, pos]), float(r.kl_to_final[i, pos])))
        frame = pd.DataFrame(rows, columns=["lens", "layer", "position", "input_token", "rank", "token_id", "token",
                                            "prob", "entropy", "kl_to_final"])
        # the strip's columns last, one value per lens and position (`decided_frame`)
        strip = self.decided_frame()
        if frame.empty or strip.empty:
            return frame
        return frame.merge(strip.drop(columns="decided_token"), on=["lens", "position"], how="left", sort=False)

    def to_csv(self) -> str:
        return self.long_frame().to_csv(index=False)

    def top1_tokens(self, lens: str = "logit", position: int = -1, cap: int = 6) -> list[int]:
        """The tokens that are the lens's top-1 at some layer at `position`, most probable first (their probability
        at the deepest layer read, 0 where they left its top-k; then the highest they reached), at most `cap`:
        what the line charts follow when no target is given."""
        r = self.lenses[lens]
        pos = position % len(self.input_ids)
        ids, probs = r.top_ids[:, pos], r.top_probs[:, pos]                  # [L, k]

        def prob(i: int, token: int) -> float:
            hit = np.flatnonzero(ids[i] == token)
            return float(probs[i, hit[0]]) if hit.size else 0.0

        tops = list(dict.fromkeys(int(t) for t in ids[:, 0]))
        tops.sort(key=lambda t: (-prob(len(ids) - 1, t), -max(prob(i, t) for i in range(len(ids)))))
        return tops[:cap]

    # -- where each token was decided (decided.py) ----------------------------------------------------
    def decided_at(self, lens: str = "logit", rule: str = "top1") -> list[int | None]:
        """Per position, the layer from which the lens reads the position's final top-1 (under `rule`) at every
        later layer it read; None where it never settles (or the rule needs more of the top-k than was read)."""
        rows = self.lenses[lens].decisions().get(rule)
        if rows is None:
            return [None] * len(self.input_ids)
        return decisions.as_layers(rows, self.layers)

    def decided_json(self, lens: str) -> dict:
        """The strip in the JSON: decided_at (top-1), its variants, and a summary (mean layer, latest)."""
        r = self.lenses[lens]
        top1 = self.decided_at(lens)
        if r.decided_tokens is not None:
            tokens = list(r.decided_tokens)
        else:
            tokens = [r.top_tokens[-1][p][0] if self.layers else "" for p in range(len(self.input_ids))]
        out = {"decided_at": top1, "decided_tokens": tokens}
        out.update({f"decided_at_{rule}": self.decided_at(lens, rule) for rule in decisions.RULES[1:]
                    if rule in r.decisions()})
        out["decided_summary"] = decisions.summary(top1, tokens)
        return out

    def decided_frame(self) -> pd.DataFrame:
        """One row per lens x position: the token decided and the layer of each rule (empty: never)."""
        rows = []
        for name in self.lenses:
            j = self.decided_json(name)
            for pos in range(len(self.input_ids)):
                rows.append({"lens": name, "position": pos, "decided_token": j["decided_tokens"][pos],
                             **{key: j[key][pos] for key in j if key.startswith("decided_at")}})
        frame = pd.DataFrame(rows)
        for col in frame.columns:
            if col.startswith("decided_at"):
                frame[col] = frame[col].astype("Int64")         # a layer, or empty where never
        return frame

    def dumps(self) -> str:
        return dumps(self)

    def to_json(self) -> dict:
        out = {
            "model": self.model, "prompt": self.prompt, "input_ids": self.input_ids,
            "input_tokens": self.input_tokens, "layers": self.layers,
            "lenses": {name: r.to_json() | self.decided_json(name) for name, r in self.lenses.items()},
            "model_next_token": self.model_next_token, "model_next_id": self.model_next_id,
        }
        if self.jlens:
            out["jlens"] = self.jlens
        if self.after_attention is not None:
            out["after_attention"] = {name: r.to_json() for name, r in self.after_attention.items()}
        return out


def _decisions(raw: Readout, ids: np.ndarray, probs: np.ndarray, next_ids: dict[int, int]) -> dict:
    """The decided_* fields of a readout: the token each position is about (the engine's final top-1, or the
    last row's top-1 where the readout has none, then `next_ids`), and each rule's rows."""
    final = raw.get("final_top_id")
    tokens = final[0].cpu().numpy().astype(np.int64) if final is not None else ids[-1, :, 0].copy()
    for pos, token in next_ids.items():
        tokens[pos] = token
    rules = [r for r in decisions.RULES if r != "top5" or ids.shape[-1] >= decisions.WIDTH]
    return {"decided_ids": tokens, "decided": {r: decisions.decided_rows(ids, probs, tokens, r) for r in rules}}

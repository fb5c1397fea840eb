"""One prompt's readout: every requested lens at every requested layer and position.

`from_*` classmethods are the only code here that touches tensors (the engine's outputs); tokens
are decoded and numbers rounded at this boundary, never inside a trace. Everything is a plain numpy
array or list afterwards, so results pickle, compare and serialise cheaply. Each lens's own readout
(its top-k, entropy, KL, targets and decisions) is a `LensReadout` (`readout.py`); this holds them with
the prompt, its tokens and the layers, and makes the views every surface shares (tables, CSV, JSON).

Shapes: L = requested layers, P = positions, k = top-k, n = targets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ..lens_kinds import reads_jlens
from . import decided as decisions
from .export import dumps
from .readout import Decode, LensReadout, Target, in_context

if TYPE_CHECKING:
    from ..engine.run.protocol import LensOutput


@dataclass
class LensResult:
    """All requested lenses for one prompt. `layers[i]` is the model layer of row i of every array.

    after_attention: with sublayers, the logit lens at each layer's residual after its attention and before
    its MLP (rows `L.attn`; the usual rows are after the MLP, `L.mlp`), at the same layers and positions.
    read_from: the first position read; those before it are blank (`LensReadout.padded`). A page reads a long
    prompt's drawn window first (`ui/brief.py`) and the whole prompt after; every other result reads them all.
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
    read_from: int = 0

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
                    skip_punctuation: bool = False, read_from: int = 0) -> LensResult:
        """One prompt's engine output -> a result. continuation_of[j]: index of target j's continuation
        in output.continuations (None: scored by its first token only). read_from: the output read positions
        read_from.. only (`LensSpec.read_from`): the others are left blank."""
        lenses = {}
        for name, raw in output.readouts.items():
            conts = [None if c is None else output.continuations[c][name] for c in continuation_of]
            lenses[name] = LensReadout.from_readout(raw, decode, targets, conts, k, skip_punctuation).padded(read_from)
        between = None
        if output.after_attention is not None:          # no continuations there: targets by their first token
            between = {name: LensReadout.from_readout(raw, decode, targets, [], k, skip_punctuation).padded(read_from)
                       for name, raw in output.after_attention.items()}
        return cls(prompt=prompt, input_ids=list(ids), input_tokens=in_context(decode, ids), layers=list(layers),
                   lenses=lenses,
                   model_next_id=output.model_next_id, model_next_token=decode([output.model_next_id])[0],
                   model=model, jlens=jlens if reads_jlens(lenses) else None, after_attention=between,
                   read_from=read_from)

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

    def to_text(self) -> str:
        """As the command line prints it without --json: top-1 per layer x position, then the last position's
        top-k, each target's probability by layer, and where each position was decided."""
        out = [f"{self.model}: {self.prompt!r} -> model's next token {self.model_next_token!r}"]
        for name in self.lenses:
            grid = self.top1_grid(name).map(repr)
            grid.columns = [repr(t) for t in self.input_tokens]
            out += [f"\n[{name} lens] top-1 per layer (rows) and input position (columns)", grid.to_string(),
                    *self._display_grid_text(name),
                    f"\n[{name} lens] top-{self.lenses[name].top_ids.shape[-1]} at the last position",
                    self.top_k_table(name).to_string(index=False)]
            for t in self.lenses[name].targets:
                out.append(f"target {t.text!r} ({t.scored_as}): p at last position by layer "
                           + " ".join(f"{p:.3g}" for p in t.probs[:, -1]))
            strip = self.decided_json(name)
            out.append(f"[{name} lens] decided at (the first layer from which each position's final top-1 stays the "
                       "top-1): " + ", ".join(f"{tok!r}: {'never' if layer is None else layer}"
                                              for tok, layer in zip(strip["decided_tokens"], strip["decided_at"])))
        return "\n".join(out)

    def _display_grid_text(self, name: str) -> list[str]:
        """With skip_punctuation: the token each cell shows, and its rank where it is not the top-1."""
        readout = self.lenses[name]
        if readout.display_ranks is None:
            return []
        grid = self.display_grid(name)
        grid.columns = [repr(t) for t in self.input_tokens]
        return [f"\n[{name} lens] skipping punctuation: the best word per cell (#rank where it is not the top-1; "
                f"'(none)': no word in the top {readout.searched})", grid.to_string()]

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

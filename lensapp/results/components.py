"""Who wrote one logit: each part's direct effect at one position, and where the attention looked from there.

`ComponentsResult.from_output` is the only code here that touches tensors (the engine's `ComponentsOutput`);
tokens are decoded and everything is a plain number or numpy array afterwards. What a part's number is
(a direct effect through the final norm frozen at the actual final residual) is `lensapp.attribution`'s
docstring; docs/using.md says it in plain words.

Shapes: L = layers, H = heads per layer, k = most attended positions kept per head, P = position + 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np
import pandas as pd

from .export import dumps
from .readout import Target

if TYPE_CHECKING:
    from ..engine.run.protocol import ComponentsOutput

Decode = Callable[[list[int]], list[str]]


def _floats(a) -> list:
    """Nested lists of plain floats (full float32 precision: parts are compared to 1e-4 of the logit)."""
    return np.asarray(a, dtype=np.float64).tolist()


@dataclass
class ComponentsResult:
    """One prompt's components readout.

    position: the position whose next-token logit is explained (0-based); target, foil: the words (their
      first tokens are the ones scored: target_token, foil_token).
    logit: the raw logit norm(h) . W_U[target] (minus the foil's), before any soft-capping or logit scale.
    embed, bias: the embedding's part and the final norm's bias term; attn, mlp [L]; heads [L, H];
      attn_bias [L]: the attention's output-projection bias (attn = heads summed + attn_bias).
    norm_scale: the final norm's scale, frozen at the actual final residual.
    top_positions [L, H, k] (int), top_weights [L, H, k]: each head's most attended positions from `position`.
    patterns_layer, pattern [H, P, P] (queries x keys 0..position): one layer's attention weights, if asked.
    """

    prompt: str
    input_ids: list[int]
    input_tokens: list[str]
    position: int
    target: Target
    target_token: str
    foil: Target | None
    foil_token: str | None
    logit: float
    embed: float
    attn: np.ndarray
    mlp: np.ndarray
    heads: np.ndarray
    attn_bias: np.ndarray
    bias: float
    norm_scale: float
    top_positions: np.ndarray
    top_weights: np.ndarray
    patterns_layer: int | None = None
    pattern: np.ndarray | None = None
    model: str = ""

    def __post_init__(self):
        L = len(self.attn)
        if self.mlp.shape != (L,) or self.attn_bias.shape != (L,) or self.heads.ndim != 2 or len(self.heads) != L:
            raise ValueError(f"inconsistent shapes: attn {self.attn.shape}, mlp {self.mlp.shape}, heads "
                             f"{self.heads.shape}, attn_bias {self.attn_bias.shape}")
        if self.top_positions.shape[:2] != self.heads.shape or self.top_weights.shape != self.top_positions.shape:
            raise ValueError(f"top attended {self.top_positions.shape} / {self.top_weights.shape} do not match heads "
                             f"{self.heads.shape}")
        if not 0 <= self.position < len(self.input_ids):
            raise ValueError(f"position {self.position} is outside the prompt's 0..{len(self.input_ids) - 1}")
        P = self.position + 1
        if self.pattern is not None and self.pattern.shape != (self.heads.shape[1], P, P):
            raise ValueError(f"pattern {self.pattern.shape} != (heads {self.heads.shape[1]}, {P}, {P})")

    @classmethod
    def from_output(cls, out: ComponentsOutput, *, prompt: str, ids: list[int], position: int, target: Target,
                    foil: Target | None, decode: Decode, patterns_layer: int | None = None,
                    model: str = "") -> ComponentsResult:
        def array(x):
            return x.float().cpu().numpy()

        return cls(prompt=prompt, input_ids=list(ids), input_tokens=decode(list(ids)), position=position,
                   target=target, target_token=decode([target.token_ids[0]])[0], foil=foil,
                   foil_token=None if foil is None else decode([foil.token_ids[0]])[0],
                   logit=float(out.logit), embed=float(out.embed), attn=array(out.attn), mlp=array(out.mlp),
                   heads=array(out.heads), attn_bias=array(out.attn_bias), bias=float(out.bias),
                   norm_scale=float(out.sigma), top_positions=out.top_positions.cpu().numpy().astype(np.int64),
                   top_weights=array(out.top_weights), patterns_layer=patterns_layer,
                   pattern=None if out.pattern is None else array(out.pattern), model=model)

    # -- derived ------------------------------------------------------------------------------------------
    @property
    def n_layers(self) -> int:
        return len(self.attn)

    @property
    def total(self) -> float:
        """The parts summed: embedding, every attention and MLP, and the norm's bias term."""
        return float(self.embed + self.attn.sum(dtype=np.float64) + self.mlp.sum(dtype=np.float64) + self.bias)

    @property
    def gap(self) -> float:
        """logit - total: zero up to rounding (the frozen norm makes the split exact)."""
        return self.logit - self.total

    @property
    def what(self) -> str:
        """What the logit is, in words: "logit(' Paris')" or "logit(' Paris') - logit(' Rome')"."""
        text = f"logit({self.target_token!r})"
        return text if self.foil is None else f"{text} - logit({self.foil_token!r})"

    def pattern_row(self) -> np.ndarray:
        """pattern [H, P] from `position` to every key 0..position (the CLI's `patterns`)."""
        if self.pattern is None:
            raise ValueError("this result was read without patterns")
        return self.pattern[:, -1, :]

    def layer_frame(self) -> pd.DataFrame:
        """One row per layer: attn, mlp, and the running total after the layer (embedding and bias first):
        the logit the frozen norm would read if the stream stopped there."""
        running = self.embed + self.bias + np.cumsum(self.attn.astype(np.float64) + self.mlp)
        return pd.DataFrame({"layer": range(self.n_layers), "attn": self.attn, "mlp": self.mlp, "running": running})

    def heads_frame(self) -> pd.DataFrame:
        """One row per layer x head: its term, and its most attended positions (tokens and weights)."""
        rows = []
        for layer in range(self.n_layers):
            for head in range(self.heads.shape[1]):
                top = zip(self.top_positions[layer, head].tolist(), self.top_weights[layer, head].tolist())
                rows.append({"layer": layer, "head": head, "value": float(self.heads[layer, head]),
                             "attends": "; ".join(f"{p}:{self.input_tokens[p]!r} {w:.2f}" for p, w in top)})
        return pd.DataFrame(rows)

    def long_frame(self) -> pd.DataFrame:
        """Every part as a row (part, layer, head, value): the CSV export."""
        rows = [("embed", None, None, self.embed)]
        for layer in range(self.n_layers):
            rows += [("attn", layer, None, float(self.attn[layer])), ("mlp", layer, None, float(self.mlp[layer])),
                     ("attn_bias", layer, None, float(self.attn_bias[layer]))]
            rows += [("head", layer, h, float(v)) for h, v in enumerate(self.heads[layer])]
        rows += [("bias", None, None, self.bias), ("sum", None, None, self.total), ("logit", None, None, self.logit)]
        frame = pd.DataFrame(rows, columns=["part", "layer", "head", "value"])
        return frame.astype({"layer": "Int64", "head": "Int64"})

    def to_csv(self) -> str:
        return self.long_frame().to_csv(index=False)

    def dumps(self) -> str:
        return dumps(self)

    def to_text(self) -> str:
        """As the command line prints it without --json: the logit and its parts by layer, the heads that wrote
        most, and a pattern's row when asked."""
        where = f"after {self.input_tokens[self.position]!r} (position {self.position})"
        out = [f"{self.model}: {self.prompt!r}", f"{self.what} {where} = {self.logit:.4f}; the parts sum to "
               f"{self.total:.4f} (embedding {self.embed:.4f}, norm bias {self.bias:.4f})",
               "\ndirect effect on it by layer (attention, MLP, running total):",
               self.layer_frame().round(4).to_string(index=False)]
        heads = self.heads_frame()
        heads = heads.reindex(heads["value"].abs().sort_values(ascending=False).index).head(8)
        out += ["\nthe heads with the largest direct effect (and where they look from the position):",
                heads.round(4).to_string(index=False)]
        if self.pattern is not None:
            out += [f"\nlayer {self.patterns_layer}'s attention from position {self.position}, per head (key: weight):"]
            out += [f"head {h}: " + "  ".join(f"{k}:{self.input_tokens[k]!r} {w:.3f}" for k, w in enumerate(weights))
                    for h, weights in enumerate(self.pattern_row())]
        return "\n".join(out)

    def to_json(self) -> dict:
        """The CLI's `components --json` (and the API's) object; string keys only (orjson)."""
        out = {
            "model": self.model, "prompt": self.prompt, "input_ids": self.input_ids, "input_tokens": self.input_tokens,
            "target": self.target.text, "foil": None if self.foil is None else self.foil.text,
            "target_token": self.target_token, "foil_token": self.foil_token, "position": self.position,
            "logit": self.logit,
            "parts": {"embed": self.embed, "attn": _floats(self.attn), "mlp": _floats(self.mlp),
                      "heads": _floats(self.heads), "bias": self.bias, "attn_bias": _floats(self.attn_bias)},
            "sum": self.total, "gap": self.gap, "norm_scale": self.norm_scale,
            "top_attended": {"positions": self.top_positions.tolist(), "weights": _floats(self.top_weights)},
        }
        if self.pattern is not None:
            out["patterns"] = {str(self.patterns_layer): _floats(self.pattern_row())}
        return out

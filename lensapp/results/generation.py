"""A generation read at every step, and a chat reply with its per-token readout."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd

from .export import dumps
from .lens import Decode, LensReadout, LensResult

if TYPE_CHECKING:
    from ..engine.run.protocol import ChatOutput, GenerationOutput


@dataclass
class GenerationStep:
    """One generation step: the readout of the newest position (step 0: every prompt position)."""

    token_id: int
    token: str
    readout: LensResult

    def to_json(self) -> dict:
        return {"token_id": self.token_id, "token": self.token, **self.readout.to_json()}


@dataclass
class GenerationResult:
    prompt: str
    text: str
    token_ids: list[int]
    tokens: list[str]
    steps: list[GenerationStep]
    model: str = ""
    seed: int | None = None
    temperature: float = 0.0

    @classmethod
    def from_output(cls, output: GenerationOutput, *, prompt: str, ids: list[int], layers: list[int],
                    decode: Decode, text: str, model: str = "", seed: int | None = None,
                    temperature: float = 0.0) -> GenerationResult:
        """Step s reads the prompt's positions (s = 0) or the token generated at step s - 1."""
        gen = output.token_ids
        steps = []
        for s, (raw, tok) in enumerate(zip(output.steps, gen)):
            pos_ids = list(ids) if s == 0 else [gen[s - 1]]
            readout = LensResult(prompt=prompt, input_ids=pos_ids, input_tokens=decode(pos_ids), layers=list(layers),
                                 lenses={n: LensReadout.from_readout(r, decode) for n, r in raw.items()},
                                 model_next_id=int(tok), model_next_token=decode([tok])[0], model=model)
            steps.append(GenerationStep(token_id=int(tok), token=decode([tok])[0], readout=readout))
        return cls(prompt=prompt, text=text, token_ids=[int(t) for t in gen], tokens=decode(gen), steps=steps,
                   model=model, seed=seed, temperature=temperature)

    def step_grid(self, lens: str = "logit") -> pd.DataFrame:
        """Top-1 per layer (rows) x step (columns, the newest position of each step)."""
        cols = {}
        for s, step in enumerate(self.steps):
            r = step.readout.lenses[lens]
            cols[s] = [layer[-1][0] for layer in r.top_tokens]
        layers = self.steps[0].readout.layers if self.steps else []
        return pd.DataFrame(cols, index=layers)

    def to_json(self) -> dict:
        out = {"model": self.model, "prompt": self.prompt, "text": self.text, "token_ids": self.token_ids,
               "tokens": self.tokens, "steps": [s.to_json() for s in self.steps]}
        if self.temperature > 0:
            out.update(temperature=self.temperature, seed=self.seed)
        return out

    def to_csv(self) -> str:
        """One row per step x lens x layer x position x rank (step 0 covers every prompt position)."""
        frames = [s.readout.long_frame().assign(step=i, generated_token=s.token) for i, s in enumerate(self.steps)]
        if not frames:
            return ""
        df = pd.concat(frames, ignore_index=True)
        first = ["step", "generated_token"]
        return df[first + [c for c in df.columns if c not in first]].to_csv(index=False)

    def dumps(self) -> str:
        return dumps(self)


@dataclass
class ChatReply:
    """One assistant turn and what one lens read at one layer while it was written.

    readout[i]: the lens's top-k (token, probability) at the position that produced tokens[i].
    dropped_turns: oldest messages left out so the conversation fits max_prompt_tokens.
    """

    text: str
    token_ids: list[int]
    tokens: list[str]
    lens: str
    layer: int
    readout: list[list[tuple[str, float]]]
    dropped_turns: int = 0

    @classmethod
    def from_output(cls, output: ChatOutput, *, decode: Decode, text: str, lens: str, layer: int,
                    dropped_turns: int = 0) -> ChatReply:
        readout = [list(zip(decode(ids), [float(p) for p in probs])) for ids, probs in
                   zip(output.top_ids, output.top_probs)]
        return cls(text=text, token_ids=[int(t) for t in output.token_ids], tokens=decode(output.token_ids), lens=lens,
                   layer=layer, readout=readout[:len(output.token_ids)], dropped_turns=dropped_turns)

    def to_json(self) -> dict:
        return {"text": self.text, "token_ids": self.token_ids, "tokens": self.tokens, "lens": self.lens,
                "layer": self.layer, "dropped_turns": self.dropped_turns,
                "readout": [[{"token": t, "prob": round(p, 5)} for t, p in step] for step in self.readout]}

"""A generation read at every step, and a chat reply with its per-token readout."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from . import decided as decisions
from .export import dumps
from .lens import LensResult
from .readout import Decode, LensReadout, in_context

if TYPE_CHECKING:
    from ..engine.run.protocol import ChatOutput, GenerationOutput


@dataclass
class GenerationStep:
    """One generation step: the readout of the newest position (step 0: every prompt position).

    newest_top {lens: (ids [L, WIDTH], probs [L, WIDTH])}: each lens's top tokens at the newest position as the worker
    read them (before the cut to k), enough for every decision rule (`decided.WIDTH`): a token forced in place of
    the one generated here gets its strip from them (branching.py). None: not kept."""

    token_id: int
    token: str
    readout: LensResult
    newest_top: dict[str, tuple[np.ndarray, np.ndarray]] | None = None

    def to_json(self) -> dict:
        return {"token_id": self.token_id, "token": self.token, **self.readout.to_json()}


@dataclass
class GenerationResult:
    """A generation and its readout at every step. forced [(step, token id)]: the tokens put in place of what
    the model said at those steps, earliest first (a branch, `branching.py`); the text after each one is
    what the model went on to say from it."""

    prompt: str
    text: str
    token_ids: list[int]
    tokens: list[str]
    steps: list[GenerationStep]
    model: str = ""
    seed: int | None = None
    temperature: float = 0.0
    forced: list[tuple[int, int]] = field(default_factory=list)

    @classmethod
    def from_output(cls, output: GenerationOutput, *, prompt: str, ids: list[int], layers: list[int],
                    decode: Decode, text: str, model: str = "", seed: int | None = None,
                    temperature: float = 0.0, k: int | None = None, read_from: int = 0) -> GenerationResult:
        """Step s reads the prompt's positions (s = 0: from `read_from` on, as the spec asked) or the token
        generated at step s - 1; each step's strip (`decided.py`) is about the token generated at it. k: the
        top-k kept (the worker may read more)."""
        gen = [int(t) for t in output.token_ids]
        shown = in_context(decode, list(ids) + gen)          # characters split over tokens, joined in context
        steps = [read_step(s, raw, ids, gen, shown, prompt=prompt, layers=layers, decode=decode, model=model, k=k,
                           read_from=read_from) for s, raw in enumerate(output.steps[:len(gen)])]
        return cls(prompt=prompt, text=text, token_ids=gen, tokens=shown[len(ids):], steps=steps,
                   model=model, seed=seed, temperature=temperature)

    @property
    def lens_names(self) -> list[str]:
        return list(self.steps[0].readout.lenses) if self.steps else []

    def decided_at(self, lens: str = "logit", rule: str = "top1") -> list[int | None]:
        """Per generated token, the layer from which the lens read it (under `rule`) at the position that produced
        it, at every later layer; None where it never settles (a sampled token that was not the top-1)."""
        out = []
        for step in self.steps:
            r = step.readout
            out.append(r.decided_at(lens, rule)[-1])
        return out

    def decided_json(self) -> dict:
        """{decided_at: {lens: [layer or None per generated token]}, decided_at_top5: ..., decided_at_p50: ...}."""
        out = {"decided_at": {name: self.decided_at(name) for name in self.lens_names}}
        for rule in decisions.RULES[1:]:
            if all(rule in s.readout.lenses[n].decisions() for s in self.steps for n in self.lens_names):
                out[f"decided_at_{rule}"] = {name: self.decided_at(name, rule) for name in self.lens_names}
        return out

    def step_grid(self, lens: str = "logit") -> pd.DataFrame:
        """Top-1 per layer (rows) x step (columns, the newest position of each step)."""
        cols = {}
        for s, step in enumerate(self.steps):
            r = step.readout.lenses[lens]
            cols[s] = [layer[-1][0] for layer in r.top_tokens]
        layers = self.steps[0].readout.layers if self.steps else []
        return pd.DataFrame(cols, index=layers)

    def to_text(self) -> str:
        """As the command line prints it without --json: the text, then per lens the newest position's top-1 by
        layer and step, and where each token was decided."""
        out = [f"{self.model}: {self.prompt!r} -> {self.text!r}"]
        out += [f"forced at step {step}: {self.tokens[step]!r} (#{token})" for step, token in self.forced]
        for name in self.steps[0].readout.lenses if self.steps else []:
            grid = self.step_grid(name).map(repr)
            grid.columns = [repr(s.token) for s in self.steps]
            out += [f"\n[{name} lens] top-1 at the newest position, per layer (rows) and step (columns)",
                    grid.to_string()]
            decided = ", ".join(f"{tok!r}: {'never' if layer is None else layer}"
                                for tok, layer in zip(self.tokens, self.decided_at(name)))
            out.append(f"[{name} lens] decided at (the first layer from which each token stays the top-1): {decided}")
        return "\n".join(out)

    def to_json(self) -> dict:
        out = {"model": self.model, "prompt": self.prompt, "text": self.text, "token_ids": self.token_ids,
               "tokens": self.tokens, "steps": [s.to_json() for s in self.steps]}
        if self.temperature > 0:
            out.update(temperature=self.temperature, seed=self.seed)
        out.update(self.decided_json())
        if self.forced:
            out["forced"] = [{"step": step, "token_id": token, "token": self.tokens[step]}
                             for step, token in self.forced]
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


def read_step(s: int, raw: dict, ids: list[int], gen: list[int], shown: list[str], *, prompt: str,
              layers: list[int], decode: Decode, model: str, k: int | None, read_from: int = 0) -> GenerationStep:
    """Step `s` of a generation from its raw readout {lens: Readout}: `gen` the tokens generated (at least s + 1 of
    them), `shown` the prompt's and theirs as display text."""
    tok = gen[s]
    if s == 0:
        pos_ids, pos_tokens = list(ids)[read_from:], shown[read_from:len(ids)]
    else:
        pos_ids, pos_tokens = [gen[s - 1]], [shown[len(ids) + s - 1]]
    nexts = {len(pos_ids) - 1: tok}
    readout = LensResult(prompt=prompt, input_ids=pos_ids, input_tokens=pos_tokens, layers=list(layers),
                         lenses={n: LensReadout.from_readout(r, decode, k=k, next_ids=nexts) for n, r in raw.items()},
                         model_next_id=tok, model_next_token=decode([tok])[0], model=model)
    newest = {n: (r["top_ids"][:, -1, :decisions.WIDTH].cpu().numpy().astype(np.int64),
                  r["top_probs"][:, -1, :decisions.WIDTH].float().cpu().numpy()) for n, r in raw.items()}
    return GenerationStep(token_id=tok, token=shown[len(ids) + s], readout=readout, newest_top=newest)


class GrowingGeneration:
    """A generation's result while its steps arrive (a streamed request): each step read once, as it comes, and
    the result so far (`so_far`) made from them. Its tokens' text is read in the context written so far: a
    character split over two tokens shows whole once both are in (the finished result reads it again, whole)."""

    def __init__(self, *, prompt: str, ids: list[int], layers: list[int], decode: Decode, model: str = "",
                 seed: int | None = None, temperature: float = 0.0, k: int | None = None, read_from: int = 0):
        self.prompt, self.ids, self.layers, self.decode, self.model = prompt, list(ids), layers, decode, model
        self.seed, self.temperature, self.k, self.read_from = seed, temperature, k, read_from
        self.token_ids: list[int] = []
        self.steps: list[GenerationStep] = []

    def add(self, token_id: int, raw: dict) -> GenerationStep:
        """The next step (its token and raw readout {lens: Readout})."""
        self.token_ids.append(int(token_id))
        shown = in_context(self.decode, self.ids + self.token_ids)
        step = read_step(len(self.steps), raw, self.ids, self.token_ids, shown, prompt=self.prompt,
                         layers=self.layers, decode=self.decode, model=self.model, k=self.k, read_from=self.read_from)
        self.steps.append(step)
        return step

    def so_far(self, text: str, n: int | None = None) -> GenerationResult:
        """The result of the first `n` steps (None: all in so far); `text`: theirs, as the service writes it."""
        ids = self.token_ids[:n]
        shown = in_context(self.decode, self.ids + ids)[len(self.ids):]
        steps = [dataclasses.replace(st, token=shown[i]) for i, st in enumerate(self.steps[:n])]
        return GenerationResult(prompt=self.prompt, text=text, token_ids=list(ids), tokens=shown,
                                steps=steps, model=self.model, seed=self.seed, temperature=self.temperature)


@dataclass
class ChatReply:
    """One assistant turn and what one lens read at one layer while it was written.

    readout[i]: the lens's top-k (token, probability) at the position that produced tokens[i].
    top_ids[i]: the same top-k's token ids (what a branch forces: `branching.py`).
    dropped_turns: oldest messages left out so the conversation fits max_prompt_tokens.
    """

    text: str
    token_ids: list[int]
    tokens: list[str]
    lens: str
    layer: int
    readout: list[list[tuple[str, float]]]
    dropped_turns: int = 0
    forced: list[tuple[int, int]] = field(default_factory=list)     # as GenerationResult's: a branch
    top_ids: list[list[int]] = field(default_factory=list)

    @classmethod
    def from_output(cls, output: ChatOutput, *, decode: Decode, text: str, lens: str, layer: int,
                    dropped_turns: int = 0) -> ChatReply:
        n = len(output.token_ids)
        readout = [list(zip(decode(ids), [float(p) for p in probs])) for ids, probs in
                   zip(output.top_ids, output.top_probs)]
        return cls(text=text, token_ids=[int(t) for t in output.token_ids],
                   tokens=in_context(decode, output.token_ids), lens=lens, layer=layer,
                   readout=readout[:n], dropped_turns=dropped_turns,
                   top_ids=[[int(i) for i in ids] for ids in output.top_ids][:n])

    def to_json(self) -> dict:
        ids = self.top_ids or [[None] * len(step) for step in self.readout]
        return {"text": self.text, "token_ids": self.token_ids, "tokens": self.tokens, "lens": self.lens,
                "layer": self.layer, "dropped_turns": self.dropped_turns,
                "readout": [[{"token": t, "prob": round(p, 5), "token_id": i} for (t, p), i in zip(step, step_ids)]
                            for step, step_ids in zip(self.readout, ids)],
                **({"forced": [{"step": step, "token_id": token, "token": self.tokens[step]}
                               for step, token in self.forced]} if self.forced else {})}


class GrowingChat:
    """A chat reply while its tokens arrive (a streamed request): each token's readout read once, as it comes."""

    def __init__(self, *, decode: Decode, lens: str, layer: int, dropped_turns: int = 0):
        self.decode, self.lens, self.layer, self.dropped_turns = decode, lens, layer, dropped_turns
        self.token_ids: list[int] = []
        self.readout: list[list[tuple[str, float]]] = []
        self.top_ids: list[list[int]] = []

    def add(self, token_id: int, top: tuple[list[int], list[float]]) -> dict:
        """The next token and its readout (top ids, top probs); its entry in `ChatReply.to_json`'s form."""
        ids, probs = [int(i) for i in top[0]], [float(p) for p in top[1]]
        self.token_ids.append(int(token_id))
        self.readout.append(list(zip(self.decode(ids), probs)))
        self.top_ids.append(ids)
        entries = [{"token": t, "prob": round(p, 5), "token_id": i} for (t, p), i in zip(self.readout[-1], ids)]
        return {"token_id": int(token_id), "token": in_context(self.decode, self.token_ids)[-1], "readout": entries}

    def so_far(self, text: str, n: int | None = None) -> ChatReply:
        """The reply of the first `n` tokens (None: all in so far); `text`: theirs, as the service writes it."""
        ids = self.token_ids[:n]
        return ChatReply(text=text, token_ids=list(ids), tokens=in_context(self.decode, ids), lens=self.lens,
                         layer=self.layer, readout=self.readout[:n], dropped_turns=self.dropped_turns,
                         top_ids=self.top_ids[:n])

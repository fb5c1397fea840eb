"""A cell described in words (Patchscopes, Ghandeharioun et al. 2024): what the model says when one of its
hidden states is put into an inspection prompt in place of a placeholder token.

One `Description` per described layer; `Descriptions` is a request's answer: one object for one layer, a
list for a sweep (the CLI's and the API's JSON alike).
"""

from __future__ import annotations

from dataclasses import dataclass

from .export import dumps


@dataclass
class Description:
    """Block `layer`'s output at `position` of `prompt` (`source_token` there), copied over block `inspect_layer`'s
    output at `inspect_position` of `inspection_prompt` in its first forward; then `token_ids` greedily."""

    prompt: str
    layer: int
    position: int
    source_token: str
    inspection_prompt: str
    inspect_layer: int
    inspect_position: int
    token_ids: list[int]
    tokens: list[str]
    text: str
    model: str = ""

    def to_json(self) -> dict:
        return {"layer": self.layer, "position": self.position, "inspection_prompt": self.inspection_prompt,
                "inspect_layer": self.inspect_layer, "inspect_position": self.inspect_position,
                "tokens": self.tokens, "text": self.text, "token_ids": self.token_ids,
                "source_token": self.source_token, "prompt": self.prompt, "model": self.model}


@dataclass
class Descriptions:
    """A request's descriptions, one per described layer (ascending); `single`: the request named one layer,
    and its answer is that description's object rather than a list."""

    items: list[Description]
    single: bool = False

    def to_json(self) -> dict | list[dict]:
        if self.single:
            return self.items[0].to_json()
        return [d.to_json() for d in self.items]

    def dumps(self) -> str:
        return dumps(self)

    def to_text(self) -> str:
        """As the command line prints it without --json: the cell, then each layer's words."""
        first = self.items[0]
        out = [f"{first.model}: {first.prompt!r}, position {first.position} ({first.source_token!r}), described "
               f"through {first.inspection_prompt!r}:"]
        out += [f"  layer {x.layer:>3} (into layer {x.inspect_layer}): {x.text!r}" for x in self.items]
        return "\n".join(out)

    def table(self) -> list[tuple[int, str]]:
        """(layer, text) per description: a column of words beside a lens's column of tokens."""
        return [(d.layer, d.text) for d in self.items]

"""Several prompts read the same way, side by side: each prompt's `LensResult`, aligned at the end.

Prompts of different lengths are aligned at their last token (right-aligned): that is where the next
token is predicted, so the columns people compare ("… of France is" against "… of Italy is") line
up. Padding is a count of empty columns before a shorter prompt, never data.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from .export import dumps
from .lens import LensResult


@dataclass
class Comparison:
    results: list[LensResult]

    def __post_init__(self):
        if len(self.results) < 2:
            raise ValueError(f"a comparison needs at least two prompts; got {len(self.results)}")
        first = self.results[0]
        for r in self.results[1:]:
            if r.layers != first.layers or set(r.lenses) != set(first.lenses):
                raise ValueError("compared results must share their layers and lenses")

    @property
    def layers(self) -> list[int]:
        return self.results[0].layers

    @property
    def lenses(self) -> list[str]:
        return list(self.results[0].lenses)

    @property
    def width(self) -> int:
        """Columns once aligned: the longest prompt's positions."""
        return max(len(r.input_ids) for r in self.results)

    def padding(self, i: int) -> int:
        """Empty columns before prompt i's first token, so every prompt ends in the last column."""
        return self.width - len(self.results[i].input_ids)

    def last_position_table(self, lens: str) -> pd.DataFrame:
        """A row per layer: each prompt's top-1 at its last position (and its probability), and whether
        they all agree there."""
        rows = []
        for i, layer in enumerate(self.layers):
            row: dict = {"layer": layer}
            tops = []
            for n, r in enumerate(self.results, 1):
                readout = r.lenses[lens]
                tops.append(int(readout.top_ids[i, -1, 0]))
                row[f"prompt {n}"] = readout.top_tokens[i][-1][0]
                row[f"p{n}"] = round(float(readout.top_probs[i, -1, 0]), 4)
            row["same top-1"] = len(set(tops)) == 1
            rows.append(row)
        return pd.DataFrame(rows)

    def part_ways(self, lens: str) -> int | None:
        """The lowest layer from which the prompts' last-position top-1 differ at every layer above it;
        None when they still agree at the top."""
        same = self.last_position_table(lens)["same top-1"].tolist()
        if same[-1]:
            return None
        split = len(same) - 1
        while split > 0 and not same[split - 1]:
            split -= 1
        return self.layers[split]

    def to_json(self) -> list[dict]:
        """Per prompt, exactly the single-prompt JSON (`lensapp lens ... --json`)."""
        return [r.to_json() for r in self.results]

    def to_csv(self) -> str:
        frames = [r.long_frame().assign(prompt=n) for n, r in enumerate(self.results, 1)]
        df = pd.concat(frames, ignore_index=True)
        return df[["prompt"] + [c for c in df.columns if c != "prompt"]].to_csv(index=False)

    def dumps(self) -> str:
        return dumps(self.results)

"""Skipping punctuation and whitespace: which token a cell shows when a view asks for words.

Most middle-layer cells of a logit lens read `.`, `,`, `␣` or a newline, and the interesting token sits
a few ranks below. With `skip_punctuation` the worker reads a wider top-k (`config.PUNCTUATION_WIDTH`)
and each cell shows the best-ranked token in it that is not punctuation or whitespace. The decision is
made on the token's decoded text, so it is the same for every tokenizer: strip whitespace, and a token
with nothing left, or only punctuation (Unicode P*) and symbols (S*), is skipped.

Shapes: L = layers, P = positions, w = the width searched.
"""

from __future__ import annotations

import unicodedata

import numpy as np

NONE_FOUND = 0          # a display rank: no word in the width searched (the cell shows its true top-1)


def is_punctuation(token: str) -> bool:
    """True for a token that is only whitespace, punctuation or symbols (`.`, `␣`, `,"`, `→`, '' too)."""
    return all(unicodedata.category(ch)[0] in "PS" for ch in token.strip())


def pick_display(tokens: list[list[list[str]]], probs: np.ndarray) -> tuple[list[list[str]], np.ndarray]:
    """tokens [L][P][w], probs [L, P, w] (best first) -> (display_tokens [L][P], display_ranks [L, P]).

    A display rank is 1-based in the true top-k; NONE_FOUND (0) where every token searched is
    punctuation, and the cell then shows its true top-1."""
    if probs.shape[:2] != (len(tokens), len(tokens[0]) if tokens else 0):
        raise ValueError(f"tokens [{len(tokens)}][...] do not match probs {probs.shape}")
    shown, ranks = [], np.zeros(probs.shape[:2], dtype=np.int64)
    for i, layer in enumerate(tokens):
        row = []
        for p, candidates in enumerate(layer):
            j = next((j for j, t in enumerate(candidates) if not is_punctuation(t)), None)
            row.append(candidates[0] if j is None else candidates[j])
            ranks[i, p] = NONE_FOUND if j is None else j + 1
        shown.append(row)
    return shown, ranks

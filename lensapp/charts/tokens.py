"""Token text for display: invisible characters made visible, clipped, unique as axis labels.

Token text is data, never markup: Vega draws it as text (SVG text nodes, escaped tooltips), and
`show_token` makes invisible characters visible (` ` -> `␣`, newline -> `↵`, tab -> `⇥`); others
that could hide or reorder a label show their code point.
"""

from __future__ import annotations

import unicodedata
from functools import lru_cache

import pandas as pd

_GLYPHS = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍", "\x7f": "␡", "\xa0": "⍽"}
_ZWSP = "\u200b"


# show_token remembers the texts it is asked most (a token's text, not a visitor's words): at most this many, of
# at most this many characters. Measured full: 5 MB of 32-letter texts, 13 MB at worst (32 invisible characters
# each, every one shown as its code point).
REMEMBERED_TEXTS, REMEMBERED_CHARS = 1 << 14, 32


def show_token(text: str) -> str:
    """Token text with whitespace, control and format characters made visible ('' -> '∅').

    Other invisible characters (no-break and thin spaces, zero-width and bidi controls, which
    could also reorder a label) show as their code point: '⟨U+200B⟩'. A short text's answer is remembered: a
    heatmap shows each cell's top tokens, ~7 per cell, mostly the same few hundred, and their letters one by one
    were a third of the time a generation's chart took to make.
    """
    return _remembered(text) if len(text) <= REMEMBERED_CHARS else _shown(text)


def _shown(text: str) -> str:
    if text == "":
        return "∅"
    return "".join(_glyph(ch) for ch in text)


_remembered = lru_cache(maxsize=REMEMBERED_TEXTS)(_shown)


def _glyph(ch: str) -> str:
    if ch in _GLYPHS:
        return _GLYPHS[ch]
    if ord(ch) < 0x20:
        return chr(0x2400 + ord(ch))                      # the Control Pictures block: ␀ ␁ ...
    if unicodedata.category(ch) in ("Zs", "Zl", "Zp", "Cc", "Cf", "Co", "Cn"):
        return f"⟨U+{ord(ch):04X}⟩"
    return ch


def clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[:max(1, n - 1)] + "…"


def display_tokens(df: pd.DataFrame) -> pd.DataFrame:
    """A copy of a token table (`top_k_table`, `long_frame`) with its token columns through `show_token`."""
    out = df.copy()
    for col in out.columns:
        if str(col).startswith("#") or col in ("token", "input_token"):
            out[col] = out[col].map(lambda v: show_token(v) if isinstance(v, str) else v)
    return out


# -- the grid every heatmap draws ---------------------------------------------------------------


def column_labels(tokens: list[str], max_chars: int) -> list[str]:
    """Visible, clipped, and unique (repeats get trailing zero-width spaces) axis labels."""
    seen: dict[str, int] = {}
    out = []
    for tok in tokens:
        label = clip(show_token(tok), max_chars)
        n = seen.get(label, 0)
        seen[label] = n + 1
        out.append(label + _ZWSP * n)
    return out

"""What every reading tab shows of a lens result beside its charts: the colour metric it can draw, the
heatmaps as tables a screen reader reads, the top-k table at one position, and a summary in words."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .. import charts
from ..results.readout import bare_first
from ..service.field import RequestError
from .tabs import md_text, table_html, warn
from .views import METRIC


def colour_metric(metric, targets, quiet: bool = False) -> str:
    """The metric to colour by: the asked-for one, or top-1 probability where it cannot be drawn (an unknown
    name, or a target metric with no target), with a warning unless `quiet`."""
    try:
        metric = METRIC(metric)
    except RequestError:
        return METRIC.default
    if charts.METRICS[metric].needs_target and not targets:
        if not quiet:
            warn("That colour needs a target word; showing top-1 probability instead.")
        return METRIC.default
    return metric


def grid_tables(result, lenses: tuple[str, ...], start: int | None = None) -> str:
    """Each heatmap as an HTML table a screen reader reads (a row per layer, a column per position drawn)."""
    return "".join(table_html(charts.lens_table(result, lens, start=start), f"{charts.LENS_TITLES[lens]}: the "
                              "token each cell shows, per layer (rows, the top layer first) and position (columns)")
                   for lens in lenses)


def top_k_tables(result, lenses: tuple[str, ...], position: int) -> pd.DataFrame:
    """The top-k table at one position, a row per layer (and lens, when there are two)."""
    if len(lenses) == 1:
        return charts.display_tokens(result.top_k_table(lenses[0], position))
    frames = [result.top_k_table(lens, position).assign(lens=charts.LENS_TITLES[lens]) for lens in lenses]
    df = pd.concat(frames, ignore_index=True)
    return charts.display_tokens(df[["lens"] + [c for c in df.columns if c != "lens"]])


def position_choices(tokens: list[str]) -> list[tuple[str, int]]:
    return [(f"{i}: {charts.clip(charts.show_token(t), 24)}", i) for i, t in enumerate(tokens)]


def lens_summary(result, lenses: tuple[str, ...]) -> str:
    """A few lines of Markdown: the model's next token and each target's score at the deepest layer."""
    lines = [f"**The model's next token:** {md_text(charts.show_token(result.model_next_token))}  ·  "
             f"{len(result.input_ids)} prompt tokens × {len(result.layers)} layers"]
    last = result.layers[-1]
    for lens in lenses:
        for t in result.lenses[lens].targets:
            p, rank = float(t.probs[-1, -1]), int(t.ranks[-1, -1])
            line = (f"{charts.LENS_TITLES[lens]}, layer {last}: P({md_text(charts.show_token(t.tokens[0]))}) = "
                    f"{100 * p:.1f}% (rank {rank})")
            if bare_first(t.tokens):          # the space's probability says nothing of the word: the word's, whole
                whole = float(t.as_read()[0][-1, -1])
                line = (f"{charts.LENS_TITLES[lens]}, layer {last}: {md_text(t.text)} is {len(t.token_ids)} tokens, "
                        f"the first only whitespace, so it is read whole: "
                        + (f"{100 * whole:.2f}%" if np.isfinite(whole) else "too long to read whole"))
            elif len(t.token_ids) > 1:
                whole = float(np.exp(t.continuation_logprob[-1])) if t.continuation_logprob is not None else None
                line += (f"; {md_text(t.text)} is {len(t.token_ids)} tokens, scored by its first"
                         + (f"; the whole word: {100 * whole:.2f}%" if whole is not None else ""))
            lines.append("- " + line)
    return "\n".join(lines)

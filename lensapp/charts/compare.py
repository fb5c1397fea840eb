"""Several prompts side by side: one heatmap per prompt (and lens) on one colour scale, aligned at the
last token, and every prompt's targets on one chart.

Shorter prompts get empty columns before their first token: padding has no cells and no labels,
so it is never drawn as data. Long prompts show their last `max_columns` positions (the end is
where they are compared).
"""

from __future__ import annotations

import altair as alt
import numpy as np

from ..results import Comparison
from .grid import LENS_TITLES, METRICS, DisplaySettings, Grid, domain_of, finish, heatmap
from .lens import curves, target_rows
from .tokens import clip, show_token


def compare_heatmaps(comparison: Comparison, lenses: tuple[str, ...] = ("logit",), metric: str = "top1_prob",
                     target: int = 0, settings: DisplaySettings = DisplaySettings()):
    """A heatmap per prompt (side by side; with two lenses, a row per prompt and a column per lens), one colour
    legend."""
    width = min(comparison.width, settings.max_columns)
    grids = {}
    for n, result in enumerate(comparison.results):
        for lens in lenses:
            grid = Grid.from_lens(result, lens)
            keep = min(len(grid.column_tokens), width)
            grids[n, lens] = (grid.window(len(grid.column_tokens) - keep, len(grid.column_tokens)), width - keep)
    values = np.concatenate([g.metric_values(metric, target).ravel() for g, _ in grids.values()])
    domain = domain_of(values, METRICS[metric])
    rows = []
    for n, result in enumerate(comparison.results):
        title = f"prompt {n + 1}: {clip(show_token(result.prompt), 60)}"
        charts = [heatmap(grid, metric, target, settings, f"{title} · {LENS_TITLES[lens]}", domain, pad=pad,
                          x_title="prompt tokens, aligned at the last one")
                  for lens in lenses for grid, pad in [grids[n, lens]]]
        rows.append(charts[0] if len(charts) == 1 else alt.hconcat(*charts, spacing=24))
    # One lens: the prompts side by side (a wide screen shows them at once; a narrow one scrolls the chart's own
    # box); two lenses: a row per prompt, a column per lens.
    concat = alt.hconcat if len(lenses) == 1 else alt.vconcat
    chart = concat(*rows, spacing=24 if len(lenses) == 1 else 18).resolve_scale(color="shared")
    return finish(chart, settings, "compare")


def compare_targets(comparison: Comparison, lenses: tuple[str, ...] = ("logit",),
                    settings: DisplaySettings = DisplaySettings()):
    """Every prompt's targets across layers at its last position, on one chart (colour: prompt)."""
    rows = []
    for n, result in enumerate(comparison.results, 1):
        for lens in lenses:
            for row in target_rows(result, lens, len(result.input_ids) - 1):
                rows.append({**row, "prompt": f"{n}: {row['target']}"})
    if not rows:
        raise ValueError("the comparison has no targets")
    return finish(curves(rows, "prompt", "lens", "P(target) at each prompt's last token"), settings, "compare-targets")

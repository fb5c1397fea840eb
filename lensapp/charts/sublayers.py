"""The logit lens inside each layer: rows `L.attn` (the residual after the layer's attention, before its MLP)
between the usual rows `L.mlp` (after the MLP), so the heatmap shows which half of a layer wrote a prediction.

Only the logit lens exists at `L.attn` (a Jacobian lens is fitted at block outputs), so this draws the logit
lens's readout of a result read with sublayers (`LensResult.after_attention`).
"""

from __future__ import annotations

from dataclasses import replace

import altair as alt
import numpy as np

from ..lens_kinds import LOGIT
from ..results import LensResult
from .grid import METRICS, DisplaySettings, Grid, Rows, cell_rows, domain_of, finish, shade, window_of
from .tokens import column_labels


def row_name(layer: int, part: str) -> str:
    return f"{layer}.{part}"


def sublayer_heatmap(result: LensResult, metric: str = "top1_prob", target: int = 0,
                     settings: DisplaySettings = DisplaySettings(), start: int | None = None, href=None):
    """Rows L.attn and L.mlp for every read layer (layer 0 at the bottom) x prompt positions, each cell the logit
    lens's top-1 there, coloured by `metric` on one scale for both kinds of row; a click on a cell opens
    `href(layer, position, top-1 token)` when given."""
    if result.after_attention is None or LOGIT.name not in result.after_attention:
        raise ValueError("this result was read without sublayers")
    parts = {"attn": Grid.from_lens(_as_lens(result), LOGIT.name), "mlp": Grid.from_lens(result, LOGIT.name)}
    cols = window_of(len(result.input_ids), start, settings)
    values = {part: g.metric_values(metric, target)[:, cols.start:cols.stop] for part, g in parts.items()}
    m = METRICS[metric]
    domain = domain_of(np.concatenate(list(values.values())), m)
    rows = []
    for part, grid in parts.items():
        window = grid.window(cols.start, cols.stop)
        for row in cell_rows(window, values[part], shade(values[part], m, domain), settings, href=href):
            rows.append(row | {"row": row_name(row["layer"], part), "part": "after attention" if part == "attn"
                               else "after the MLP"})
    order = [row_name(layer, part) for layer in reversed(result.layers) for part in ("mlp", "attn")]
    labels = column_labels(result.input_tokens[cols.start:cols.stop], settings.max_label_chars)
    k = min(result.lenses[LOGIT.name].top_probs.shape[-1], settings.tooltip_k)
    title = parts["mlp"].metric_title(metric, target)
    base = alt.Chart().encode(
        x=alt.X("column:N", sort=labels, title="prompt tokens (position →)",
                axis=alt.Axis(labelAngle=-40, labelAlign="right", labelLimit=120, labelFontSize=11)),
        y=alt.Y("row:N", sort=order, title="layer . part", axis=alt.Axis(labelFontSize=11)),
        tooltip=[alt.Tooltip("row:N", title="row"), alt.Tooltip("part:N", title="read"),
                 alt.Tooltip("position:O"), alt.Tooltip("token:N", title="input token"),
                 alt.Tooltip("value:Q", title=title, format=".4~g")]
        + [alt.Tooltip(f"t{j + 1}:N", title=f"#{j + 1}") for j in range(k)])
    rect = base.mark_rect(stroke="white", strokeWidth=0.5).encode(
        color=alt.Color("value:Q", scale=alt.Scale(scheme=settings.scheme, domain=list(domain),
                                                   type="log" if m.log else "linear", reverse=m.log),
                        title=title, legend=alt.Legend(orient="top", direction="horizontal", gradientLength=220)))
    if href is not None:
        rect = rect.encode(href="href:N")
    text = base.mark_text(fontSize=settings.font_size, limit=settings.cell_width - 4).encode(
        text="top1:N", color=alt.condition("datum.ink === 'white'", alt.value("white"), alt.value("black")))
    shown = f" (positions {cols.start}-{cols.stop - 1})" if len(cols) < len(result.input_ids) else ""
    chart = alt.layer(rect, text, data=alt.Data(values=Rows(rows))).properties(
        width=alt.Step(settings.cell_width), height=alt.Step(settings.cell_height),
        title=f"logit lens inside each layer: L.attn after the attention, L.mlp after the MLP{shown}")
    return finish(chart, settings, "logit-lens-sublayers")


def _as_lens(result: LensResult) -> LensResult:
    """The result with its after-attention readout in place of its lenses (the same layers and positions)."""
    return replace(result, lenses=dict(result.after_attention), after_attention=None)

"""The charts of an intervention: one lens before and after a change on one colour scale, their difference,
the word's probability across layers before and after, and the dose-response curve of a sweep."""

from __future__ import annotations

import altair as alt
import numpy as np

from ..results import InterventionResult
from .grid import LENS_TITLES, METRICS, DisplaySettings, Grid, Rows, domain_of, finish, finite, heatmap, window_of
from .lens import curves, target_rows
from .tokens import clip, column_labels, show_token


def before_after(result: InterventionResult, index: int, lens: str = "logit", metric: str = "top1_prob",
                 settings: DisplaySettings = DisplaySettings(), start: int | None = None):
    """The lens's heatmap before and after change `index`, side by side on one colour scale."""
    grids = [Grid.from_lens(result.before, lens), Grid.from_lens(result.after[index], lens)]
    domain = domain_of(np.concatenate([g.metric_values(metric) for g in grids], axis=1), METRICS[metric])
    cols = window_of(len(result.before.input_ids), start, settings)
    titles = [f"{LENS_TITLES[lens]}, before", f"{LENS_TITLES[lens]}, after {result.labels[index]}"]
    parts = [heatmap(g.window(cols.start, cols.stop), metric, 0, settings, t, domain) for g, t in zip(grids, titles)]
    return finish(alt.hconcat(*parts, spacing=24).resolve_scale(color="shared"), settings, f"{lens}-before-after")


def difference(result: InterventionResult, index: int, lens: str = "logit",
               settings: DisplaySettings = DisplaySettings(), start: int | None = None):
    """After minus before, cell by cell: the word's probability (top-1 probability when there is no word);
    each cell shows its top-1 after the change, marked where it changed."""
    after = Grid.from_lens(result.after[index], lens)
    before = Grid.from_lens(result.before, lens)
    cols = window_of(len(result.before.input_ids), start, settings)
    delta = result.difference(index, lens)[:, cols.start:cols.stop]
    labels = column_labels(after.column_tokens[cols.start:cols.stop], settings.max_label_chars)
    what = f"P({show_token(result.word)})" if result.word else "top-1 probability"
    rows = []
    for i, layer in enumerate(after.layers):
        for c, label in enumerate(labels):
            was, now = before.top_tokens[i][cols.start + c][0], after.top_tokens[i][cols.start + c][0]
            rows.append({"layer": int(layer), "position": cols.start + c, "column": label,
                         "delta": finite(delta[i, c]),
                         "top1": clip(show_token(now), settings.max_cell_chars) + ("*" if now != was else ""),
                         "before": show_token(was), "after": show_token(now)})
    span = float(np.nanmax(np.abs(delta))) if np.isfinite(delta).any() and np.abs(delta).max() > 0 else 1.0
    base = alt.Chart().encode(
        x=alt.X("column:N", sort=labels, title="prompt tokens (position →)",
                axis=alt.Axis(labelAngle=-40, labelAlign="right", labelLimit=120, labelFontSize=11)),
        y=alt.Y("layer:O", sort="descending", title="layer"),
        tooltip=["layer:O", "position:O", alt.Tooltip("before:N", title="top-1 before"),
                 alt.Tooltip("after:N", title="top-1 after"), alt.Tooltip("delta:Q", title=f"change in {what}",
                                                                           format="+.4f")])
    rect = base.mark_rect(stroke="white", strokeWidth=0.5).encode(
        color=alt.Color("delta:Q", scale=alt.Scale(scheme=settings.diverging_scheme, domain=[-span, span]),
                        title=f"change in {what} (after − before)",
                        legend=alt.Legend(orient="top", direction="horizontal", gradientLength=220, titleLimit=500)))
    text = base.mark_text(fontSize=settings.font_size, limit=settings.cell_width - 4).encode(text="top1:N")
    chart = alt.layer(rect, text, data=alt.Data(values=Rows(rows))).properties(
        width=alt.Step(settings.cell_width), height=alt.Step(settings.cell_height),
        title=f"{LENS_TITLES[lens]}: the difference {result.labels[index]} makes (* = the top-1 changed)")
    return finish(chart, settings, f"{lens}-difference")


def word_across_layers(result: InterventionResult, index: int, lens: str = "logit",
                       settings: DisplaySettings = DisplaySettings()):
    """Each target's probability and rank by layer at the last position, before and after change `index`."""
    last = len(result.before.input_ids) - 1
    rows = (target_rows(result.before, lens, last, readout="before")
            + target_rows(result.after[index], lens, last, readout=f"after {result.labels[index]}"))
    if not rows:
        raise ValueError("the result has no targets")
    return finish(curves(rows, "target", "readout", f"{LENS_TITLES[lens]}: P(target) by layer, before and after"),
                  settings, f"{lens}-targets-before-after")


def dose_response(result: InterventionResult, settings: DisplaySettings = DisplaySettings()):
    """The word's final probability (the model's output) for each change of a sweep; the dashed line is before."""
    table = result.dose_response()
    if table.empty or not result.sweep:
        raise ValueError("a dose-response curve needs a word and a sweep (several alphas, or a patch over layers)")
    swept = "alpha" if result.intervention.kind == "steer" else "patched layer"
    rows = [{"value": float(v), "prob": finite(p), "rank": int(k), "change": c}
            for c, v, p, k in table.iloc[1:].itertuples(index=False)]
    before = float(table.iloc[0]["prob"])
    x = alt.X("value:Q", title=swept)
    line = alt.Chart(alt.Data(values=Rows(rows))).mark_line(point=True).encode(
        x=x, y=alt.Y("prob:Q", title=f"P({show_token(result.word)}) at the output", scale=alt.Scale(domain=[0, 1])),
        tooltip=["change:N", alt.Tooltip("prob:Q", format=".4f"), "rank:Q"])
    rule = alt.Chart(alt.Data(values=[{"prob": before}])).mark_rule(strokeDash=[4, 4], color="gray").encode(
        y="prob:Q", tooltip=[alt.Tooltip("prob:Q", title="before", format=".4f")])
    chart = alt.layer(line, rule).properties(width=360, height=220,
                                             title=f"Dose-response: the model's P({show_token(result.word)}) "
                                                   f"by {swept} (dashed: before)")
    return finish(chart, settings, "dose-response")

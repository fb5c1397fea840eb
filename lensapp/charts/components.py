"""The charts of a components readout: who wrote the logit by layer, by head, and where a layer's heads look.

    layer_bars      per layer, the attention's and the MLP's direct effect side by side, and the running total
    head_heatmap    layers x heads, each head's direct effect; hover for its value and where it looks from there
    pattern_row     one layer's heads x earlier positions: the attention weights from the position
    pattern_grid    the same layer's full pattern per head (queries x keys), small multiples, over a window

Each takes a `ComponentsResult` and returns a finished Altair chart; nothing here runs a model.
"""

from __future__ import annotations

import altair as alt
import numpy as np

from ..results import ComponentsResult
from .grid import DisplaySettings, Rows, finish, finite
from .tokens import clip, column_labels, show_token

PARTS = {"attention": "#0072b2", "MLP": "#e69f00"}       # blue and orange: apart under every colour vision
PATTERN_WINDOW = 24                                     # positions a pattern's small multiples draw at most


def _where(result: ComponentsResult) -> str:
    return f"after {show_token(result.input_tokens[result.position])} (position {result.position})"


def layer_bars(result: ComponentsResult, settings: DisplaySettings = DisplaySettings()):
    """Bars: each layer's attention and MLP direct effect on the logit; line: the running total after each layer
    (the embedding and the final norm's bias first), which ends at the logit."""
    frame = result.layer_frame()
    bars = [{"layer": int(r.layer), "part": part, "value": finite(getattr(r, key)), "running": finite(r.running)}
            for r in frame.itertuples() for part, key in (("attention", "attn"), ("MLP", "mlp"))]
    line = [{"layer": int(r.layer), "running": finite(r.running)} for r in frame.itertuples()]
    x = alt.X("layer:O", title="layer", axis=alt.Axis(labelAngle=0))
    colour = alt.Color("part:N", scale=alt.Scale(domain=list(PARTS), range=list(PARTS.values())),
                       legend=alt.Legend(orient="top", title=None))
    bar = alt.Chart(alt.Data(values=bars)).mark_bar().encode(
        x=x, xOffset=alt.XOffset("part:N", sort=list(PARTS)),
        y=alt.Y("value:Q", title=f"direct effect on {result.what}"), color=colour,
        tooltip=["layer:O", "part:N", alt.Tooltip("value:Q", format="+.4f"),
                 alt.Tooltip("running:Q", title="running total after the layer", format=".4f")])
    total = alt.Chart(alt.Data(values=line)).mark_line(point=True, color="#555555").encode(
        x=x, y="running:Q", tooltip=["layer:O", alt.Tooltip("running:Q", title="running total", format=".4f")])
    zero = alt.Chart(alt.Data(values=[{"y": 0}])).mark_rule(color="#999999").encode(y="y:Q")
    chart = alt.layer(zero, bar, total).properties(
        width=max(360, 22 * result.n_layers), height=260,
        title=f"Who wrote {result.what} {_where(result)}: {result.logit:.3f} = embedding {result.embed:.3f}"
              f" + attention + MLP (bars, by layer) + norm bias {result.bias:.3f}; line: running total")
    return finish(chart, settings, "components-by-layer")


def head_heatmap(result: ComponentsResult, settings: DisplaySettings = DisplaySettings()):
    """Layers (0 at the bottom) x heads, coloured by each head's direct effect (blue against orange); hover for
    the value and the positions the head attends most from the readout's position."""
    frame = result.heads_frame()
    span = float(np.abs(result.heads).max()) or 1.0
    rows = [{"layer": int(r.layer), "head": int(r.head), "value": finite(r.value), "attends": r.attends,
             "text": f"{r.value:+.2f}" if abs(r.value) >= 0.25 * span else ""} for r in frame.itertuples()]
    base = alt.Chart().encode(
        x=alt.X("head:O", title="head", axis=alt.Axis(labelAngle=0)),
        y=alt.Y("layer:O", sort="descending", title="layer"),
        tooltip=["layer:O", "head:O", alt.Tooltip("value:Q", title="direct effect", format="+.4f"),
                 alt.Tooltip("attends:N", title="attends most (position:token weight)")])
    rect = base.mark_rect(stroke="white", strokeWidth=0.5).encode(
        color=alt.Color("value:Q", scale=alt.Scale(scheme=settings.diverging_scheme, domain=[-span, span]),
                        title=f"direct effect on {result.what}",
                        legend=alt.Legend(orient="top", direction="horizontal", gradientLength=220, titleLimit=500)))
    text = base.mark_text(fontSize=settings.font_size).encode(text="text:N")
    chart = alt.layer(rect, text, data=alt.Data(values=Rows(rows))).properties(
        width=alt.Step(max(28, settings.cell_height + 14)), height=alt.Step(settings.cell_height),
        title=f"Each head's direct effect on {result.what} {_where(result)}")
    return finish(chart, settings, "components-by-head")


def _pattern_checked(result: ComponentsResult) -> np.ndarray:
    if result.pattern is None:
        raise ValueError("this result was read without patterns: ask for a patterns layer")
    return result.pattern


def pattern_row(result: ComponentsResult, settings: DisplaySettings = DisplaySettings()):
    """Heads (rows) x key positions 0..position: layer `patterns_layer`'s weights from the readout's position."""
    row = _pattern_checked(result)[:, -1, :]
    labels = column_labels(result.input_tokens[:result.position + 1], settings.max_label_chars)
    rows = [{"head": h, "key": k, "column": labels[k], "token": show_token(result.input_tokens[k]),
             "weight": finite(row[h, k])} for h in range(row.shape[0]) for k in range(row.shape[1])]
    base = alt.Chart().encode(
        x=alt.X("column:N", sort=labels, title="attended position (key)",
                axis=alt.Axis(labelAngle=-40, labelAlign="right", labelLimit=120)),
        y=alt.Y("head:O", title="head"),
        tooltip=["head:O", alt.Tooltip("key:O", title="position"), alt.Tooltip("token:N", title="token"),
                 alt.Tooltip("weight:Q", format=".4f")])
    rect = base.mark_rect(stroke="white", strokeWidth=0.5).encode(
        color=alt.Color("weight:Q", scale=alt.Scale(scheme=settings.scheme, domain=[0, 1]), title="attention weight",
                        legend=alt.Legend(orient="top", direction="horizontal", gradientLength=220)))
    chart = alt.layer(rect, data=alt.Data(values=Rows(rows))).properties(
        width=alt.Step(min(settings.cell_width, 40)), height=alt.Step(settings.cell_height),
        title=f"Layer {result.patterns_layer}: where each head looks from {_where(result)}")
    return finish(chart, settings, f"attention-layer-{result.patterns_layer}")


def pattern_grid(result: ComponentsResult, settings: DisplaySettings = DisplaySettings(), window: int = PATTERN_WINDOW):
    """One small heatmap per head: queries (rows) x keys (columns) of layer `patterns_layer`, over the last `window`
    positions up to the readout's (a longer prompt's earlier positions are left out, and the title says so)."""
    pattern = _pattern_checked(result)
    P = pattern.shape[-1]
    first = max(0, P - window)
    tokens = [clip(show_token(t), 8) for t in result.input_tokens[:P]]
    rows = [{"head": f"head {h}", "query": q, "key": k, "q_token": tokens[q], "k_token": tokens[k],
             "weight": finite(pattern[h, q, k])}
            for h in range(pattern.shape[0]) for q in range(first, P) for k in range(first, q + 1)]
    span = f" (positions {first}-{P - 1} of 0-{P - 1})" if first else ""
    chart = alt.Chart(alt.Data(values=Rows(rows))).mark_rect().encode(
        x=alt.X("key:O", title="key position"), y=alt.Y("query:O", title="query position"),
        color=alt.Color("weight:Q", scale=alt.Scale(scheme=settings.scheme, domain=[0, 1]), title="weight"),
        tooltip=["head:N", "query:O", alt.Tooltip("q_token:N", title="query token"), "key:O",
                 alt.Tooltip("k_token:N", title="key token"), alt.Tooltip("weight:Q", format=".4f")],
    ).properties(width=150, height=150).facet(
        facet=alt.Facet("head:N", title=None, sort=[f"head {h}" for h in range(pattern.shape[0])]), columns=4,
    ).properties(title=f"Layer {result.patterns_layer}'s attention pattern per head{span}")
    return finish(chart, settings, f"attention-pattern-layer-{result.patterns_layer}")

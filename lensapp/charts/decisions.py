"""Where each token was decided, drawn: a strip under a heatmap (one row per lens, one cell per column, the layer
from which the column's token stays the top-1, under a chosen rule), and where branches of a generation part.

The strip's columns are the heatmap's (the same labels, the same width and window), so it reads as one more
row under it: a dark cell decided early, a light one late, a grey one never.
"""

from __future__ import annotations

import altair as alt

from ..results import GenerationResult, LensResult
from ..results.branching import changed_layers, parting
from ..results.decided import RULE_TITLES
from .grid import LENS_TITLES, DisplaySettings, Rows, finish, window_of
from .tokens import column_labels, show_token


def decision_strip(result: LensResult | GenerationResult, rule: str = "top1",
                   settings: DisplaySettings = DisplaySettings(), start: int | None = None):
    """One row per lens: per position (a lens result) or generated token (a generation), the first layer from which
    its token holds under `rule` (results/decided.py) to the last layer; empty where it never settles."""
    if rule not in RULE_TITLES:
        raise ValueError(f"unknown rule {rule!r}; one of {tuple(RULE_TITLES)}")
    if isinstance(result, GenerationResult):
        lenses, columns = result.lens_names, list(result.tokens)
        n_layers = max(result.steps[0].readout.layers) if result.steps else 0
        decided = {name: result.decided_at(name, rule) for name in lenses}
        about = {name: list(result.tokens) for name in lenses}
        kind = "step"
    else:
        lenses, columns, n_layers = list(result.lenses), list(result.input_tokens), max(result.layers)
        decided = {name: result.decided_at(name, rule) for name in lenses}
        about = {name: result.decided_json(name)["decided_tokens"] for name in lenses}
        kind = "position"
    cols = window_of(len(columns), start, settings) if kind == "position" else range(len(columns))
    labels = column_labels([columns[c] for c in cols], settings.max_label_chars)
    rows = []
    for name in lenses:
        for label, c in zip(labels, cols):
            layer = decided[name][c]
            rows.append({"lens": LENS_TITLES.get(name, name), "column": label, kind: c,
                         "token": show_token(columns[c]), "decided": show_token(about[name][c]),
                         "layer": layer, "text": "–" if layer is None else str(layer),
                         "ink": "black" if layer is None or layer > 0.55 * n_layers else "white"})
    x = alt.X("column:N", sort=labels, scale=alt.Scale(domain=labels), title=None,
              axis=alt.Axis(labels=False, ticks=False, domain=False))
    y = alt.Y("lens:N", title=None, sort=[LENS_TITLES.get(n, n) for n in lenses], axis=alt.Axis(labelFontSize=11))
    tooltip = [alt.Tooltip(f"{kind}:O"), alt.Tooltip("token:N", title="input token" if kind == "position" else
                                                      "generated"),
               alt.Tooltip("decided:N", title="the token decided"), alt.Tooltip("text:N", title="decided at layer")]
    base = alt.Chart().encode(x=x, y=y, tooltip=tooltip)
    never = base.mark_rect(stroke="white", strokeWidth=0.5, color="#d0d0d0")
    cells = base.mark_rect(stroke="white", strokeWidth=0.5).encode(
        color=alt.Color("layer:Q", scale=alt.Scale(scheme=settings.scheme, domain=[0, max(1, n_layers)]),
                        title="decided at layer", legend=None)).transform_filter("datum.layer !== null")
    text = base.mark_text(fontSize=settings.font_size).encode(
        text="text:N", color=alt.condition("datum.ink === 'white'", alt.value("white"), alt.value("black")))
    what = "the token it predicts" if kind == "position" else "the token generated"
    chart = alt.layer(never, cells, text, data=alt.Data(values=Rows(rows))).properties(
        width=alt.Step(settings.cell_width), height=alt.Step(settings.cell_height),
        title=f"Decided at: the layer from which {what} is {RULE_TITLES[rule]} up to the last layer (– never)")
    return finish(chart, settings, f"decided-{rule}")


def branch_divergence(a: GenerationResult, b: GenerationResult, lens: str = "logit",
                      settings: DisplaySettings = DisplaySettings()):
    """Two generations from where they part: per step (columns) and layer (rows), whether the lens's top-1 at the
    newest position differs between them (coloured) or agrees (grey)."""
    start = parting(a, b)
    if start is None:
        raise ValueError("the two generations are the same: nothing parts")
    changes = changed_layers(a, b, lens)
    layers = a.steps[0].readout.layers
    rows = []
    for change in changes:
        column = f"{change['step']}: {show_token(change['tokens'][0])} / {show_token(change['tokens'][1])}"
        for layer in layers:
            rows.append({"column": column, "step": change["step"], "layer": int(layer),
                         "differs": "differs" if layer in change["layers"] else "same top-1"})
    order = list(dict.fromkeys(r["column"] for r in rows))
    chart = alt.Chart(alt.Data(values=Rows(rows))).mark_rect(stroke="white", strokeWidth=0.5).encode(
        x=alt.X("column:N", sort=order, title="step: this branch's token / the other's",
                axis=alt.Axis(labelAngle=-40, labelAlign="right", labelLimit=160)),
        y=alt.Y("layer:O", sort="descending", title="layer", axis=alt.Axis(labelFontSize=9)),
        color=alt.Color("differs:N", scale=alt.Scale(domain=["differs", "same top-1"], range=["#e45756", "#d0d0d0"]),
                        title=None, legend=alt.Legend(orient="top")),
        tooltip=["step:O", "layer:O", "differs:N"],
    ).properties(width=alt.Step(settings.cell_width), height=alt.Step(11),
                 title=f"Where they part (step {start}) and which layers changed their mind ({LENS_TITLES[lens]})")
    return finish(chart, settings, "branches")

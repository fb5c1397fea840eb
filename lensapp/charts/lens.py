"""The charts of one prompt's readout: its heatmap, both lenses side by side, where they differ, targets,
and a generation's heatmap.

A prompt longer than `DisplaySettings.max_columns` is drawn as a window of that many positions
(by default the last ones, where the next token is predicted) under an overview of every position
(layers averaged in a few bands, no text), on which the window is the part at full strength: a
few hundred positions draw in about the time of fifty.
"""

from __future__ import annotations

import warnings

import altair as alt
import numpy as np
import pandas as pd

from ..lens_kinds import JACOBIAN, LOGIT, shown
from ..results import GenerationResult, LensResult
from .grid import (
    LENS_TITLES,
    METRICS,
    DisplaySettings,
    Grid,
    Highlight,
    Rows,
    domain_of,
    finish,
    finite,
    heatmap,
    window_of,
)
from .tokens import clip, column_labels, show_token


def lens_heatmap(result: LensResult, lens: str = "logit", metric: str = "top1_prob", target: int = 0,
                 settings: DisplaySettings = DisplaySettings(), start: int | None = None,
                 highlight: Highlight = Highlight(), href=None):
    """Layers x prompt tokens; each cell the lens's top-1 token (or, skipping punctuation, its best word),
    coloured by `metric`; the cells `highlight` names are outlined; a click on a cell opens
    `href(layer, position, top-1 token)` when given (the Components tab's "who wrote this?")."""
    grid = Grid.from_lens(result, lens)
    cols = window_of(len(grid.column_tokens), start, settings)
    what = "top-1 token" if grid.shown is None else "best word (skipping punctuation; ² = rank 2)"
    title = f"{LENS_TITLES[lens]}: {what} per layer and position" + _range(cols, len(grid.column_tokens))
    chart = heatmap(grid.window(cols.start, cols.stop), metric, target, settings, title,
                    domain=domain_of(grid.metric_values(metric, target), METRICS[metric]), highlight=highlight,
                    href=href)
    return finish(_with_overview(chart, grid, metric, target, cols, settings), settings, f"{lens}-lens")


def lens_pair(result: LensResult, metric: str = "top1_prob", target: int = 0,
              settings: DisplaySettings = DisplaySettings(), start: int | None = None,
              highlight: Highlight = Highlight()):
    """Jacobian lens and logit lens side by side over the same cells, on one colour scale."""
    grids = {lens: Grid.from_lens(result, lens) for lens in (JACOBIAN.name, LOGIT.name)}
    both = np.concatenate([g.metric_values(metric, target) for g in grids.values()], axis=1)
    domain = domain_of(both, METRICS[metric])
    cols = window_of(len(result.input_ids), start, settings)
    charts = [heatmap(g.window(cols.start, cols.stop), metric, target, settings,
                      LENS_TITLES[lens] + _range(cols, len(result.input_ids)), domain, highlight=highlight)
              for lens, g in grids.items()]
    chart = alt.hconcat(*charts, spacing=24).resolve_scale(color="shared")
    return finish(chart, settings, "jacobian-vs-logit")


def lens_diff(result: LensResult, settings: DisplaySettings = DisplaySettings(), start: int | None = None):
    """Cells where the two lenses' top-1 differ; colour: KL to final, logit lens minus J-lens.

    Positive (orange): the J-lens reads closer to the model's own output there.
    """
    cols = window_of(len(result.input_ids), start, settings)
    j = Grid.from_lens(result, JACOBIAN.name).window(cols.start, cols.stop)
    lg = Grid.from_lens(result, LOGIT.name).window(cols.start, cols.stop)
    labels = column_labels(j.column_tokens, settings.max_label_chars)
    delta = lg.kl - j.kl
    rows = []
    for i, layer in enumerate(j.layers):
        for c, label in enumerate(labels):
            tj, tl = j.top_tokens[i][c][0], lg.top_tokens[i][c][0]
            differ = tj != tl
            rows.append({
                "layer": int(layer), "position": j.first + c, "column": label,
                "token": show_token(j.column_tokens[c]), "differ": "differs" if differ else "same top-1",
                "delta": finite(delta[i, c]) if differ else None,
                "top1": clip(show_token(tj), settings.max_cell_chars) if differ else "",
                "jlens": f"{show_token(tj)}   {100 * float(j.top_probs[i, c, 0]):.1f}%",
                "logit": f"{show_token(tl)}   {100 * float(lg.top_probs[i, c, 0]):.1f}%",
                "kl_j": finite(j.kl[i, c]), "kl_l": finite(lg.kl[i, c]),
            })
    span = float(np.nanmax(np.abs(delta))) if np.isfinite(delta).any() else 1.0
    x = alt.X("column:N", sort=labels, title="prompt tokens (position →)",
              axis=alt.Axis(labelAngle=-40, labelAlign="right", labelLimit=120, labelFontSize=11))
    y = alt.Y("layer:O", sort="descending", title="layer")
    tooltip = [alt.Tooltip("layer:O"), alt.Tooltip("position:O"), alt.Tooltip("token:N", title="input token"),
               alt.Tooltip("jlens:N", title="J-lens top-1"), alt.Tooltip("logit:N", title="logit lens top-1"),
               alt.Tooltip("kl_j:Q", title="J-lens KL to final", format=".3f"),
               alt.Tooltip("kl_l:Q", title="logit lens KL to final", format=".3f")]
    base = alt.Chart().encode(x=x, y=y, tooltip=tooltip)
    # Every cell grey, then the differing ones coloured on top: a null colour value would drop the mark.
    agree = base.mark_rect(stroke="white", strokeWidth=0.5, color="#c4c4c4")
    differ = base.mark_rect(stroke="white", strokeWidth=0.5).encode(
        color=alt.Color("delta:Q", scale=alt.Scale(scheme=settings.diverging_scheme, domain=[-span, span]),
                        title="KL to final, logit lens − J-lens (nats): orange = J-lens closer to the output",
                        legend=alt.Legend(orient="top", direction="horizontal", gradientLength=220, titleLimit=600)),
    ).transform_filter("datum.delta !== null")
    text = base.mark_text(fontSize=settings.font_size, limit=settings.cell_width - 4).encode(text="top1:N")
    chart = alt.layer(agree, differ, text, data=alt.Data(values=Rows(rows))).properties(
        width=alt.Step(settings.cell_width), height=alt.Step(settings.cell_height),
        title="Where the lenses disagree: the J-lens top-1 is shown; empty grey cells agree"
              + _range(cols, len(result.input_ids)))
    return finish(chart, settings, "jacobian-logit-diff")


def target_curves(result: LensResult, lenses: tuple[str, ...] = ("logit",), position: int = -1,
                  settings: DisplaySettings = DisplaySettings()):
    """Each target's probability and rank across layers, at one position (default: the last).

    At the last position a multi-token target is scored whole (its continuation probability);
    elsewhere, and for the rank, by its first token.
    """
    rows = []
    pos = position % len(result.input_ids)
    for lens in lenses:
        rows += target_rows(result, lens, pos)
    if not rows:
        raise ValueError("the result has no targets")
    where = show_token(result.input_tokens[pos])
    return finish(curves(rows, "target", "lens", f"P(target) after {where}"), settings, "targets")


def top1_curves(result: LensResult, lenses: tuple[str, ...] = ("logit",), position: int = -1, cap: int = 6,
                settings: DisplaySettings = DisplaySettings()):
    """With no target given: the tokens that were the top-1 at any layer at one position (at most `cap`, most
    probable first, per lens), their probability and rank across layers where they are in the readout's top-k
    (a line breaks where a token falls out of it: below the top-k nothing is known)."""
    pos = position % len(result.input_ids)
    rows = []
    for lens in lenses:
        r = result.lenses[lens]
        for token in result.top1_tokens(lens, pos, cap):
            text = next(r.top_tokens[i][pos][j] for i in range(len(result.layers))
                        for j in range(r.top_ids.shape[-1]) if r.top_ids[i, pos, j] == token)
            run = 0
            for i, layer in enumerate(result.layers):
                hit = np.flatnonzero(r.top_ids[i, pos] == token)
                if not hit.size:
                    run += 1                                  # the next stretch in the top-k is a new line
                    continue
                rows.append({"layer": int(layer), "target": show_token(text), "lens": LENS_TITLES[lens],
                             "prob": finite(r.top_probs[i, pos, hit[0]]), "rank": int(hit[0]) + 1,
                             "run": f"{lens}:{token}:{run}"})
    where = show_token(result.input_tokens[pos])
    return finish(curves(rows, "target", "lens", f"The tokens that were top-1 at some layer, after {where}",
                         detail="run"), settings, "top1-tokens")


def target_rows(result: LensResult, lens: str, pos: int, **extra) -> list[dict]:
    """One row per target x layer: probability (the whole word at the last position) and rank (none where the
    word's first token is only whitespace: `TargetScore.as_read`)."""
    rows = []
    whole_ok = pos == len(result.input_ids) - 1
    for t in result.lenses[lens].targets:
        whole = whole_ok and t.continuation_logprob is not None
        read, ranks = t.as_read()
        probs = np.exp(t.continuation_logprob) if whole else read[:, pos]
        name = show_token(t.text) + (" (whole word)" if whole else "")
        for i, layer in enumerate(result.layers):
            rows.append({"layer": int(layer), "target": name, "lens": LENS_TITLES[lens],
                         "prob": finite(probs[i]), "rank": int(ranks[i, pos]) or None, **extra})
    return rows


def curves(rows: list[dict], color: str, dash: str, title: str, detail: str | None = None):
    """Probability and rank across layers, one line per (color, dash) pair (and per `detail` value: a line's
    separate stretches)."""
    layers = [r["layer"] for r in rows]
    base = alt.Chart().encode(
        x=alt.X("layer:Q", title="layer", scale=alt.Scale(domain=[min(layers), max(layers)])),
        color=alt.Color(f"{color}:N", scale=alt.Scale(scheme="tableau10"), title=color),
        strokeDash=alt.StrokeDash(f"{dash}:N", title=dash),
        tooltip=[f"{color}:N", f"{dash}:N", "layer:Q", alt.Tooltip("prob:Q", format=".4f"), "rank:Q"])
    if detail is not None:
        base = base.encode(detail=f"{detail}:N")
    prob = base.mark_line(point=True).encode(y=alt.Y("prob:Q", title="probability", scale=alt.Scale(domain=[0, 1])))
    rank = base.mark_line(point=True).encode(
        y=alt.Y("rank:Q", title="rank (1 = top, log)", scale=alt.Scale(type="log", reverse=True)))
    return alt.hconcat(
        alt.layer(prob, data=alt.Data(values=Rows(rows))).properties(width=320, height=200, title=title),
        alt.layer(rank, data=alt.Data(values=Rows(rows))).properties(width=320, height=200,
                                                               title="rank of the target's first token"))


def generation_heatmap(gen: GenerationResult, lens: str = "logit", metric: str = "top1_prob",
                       settings: DisplaySettings = DisplaySettings()):
    """Layers x generation steps: each cell the lens's top-1 at the newest position of that step.

    Column s is labelled by the token the model produced at step s; a cell equal to its column
    label means that layer already said what the model went on to say.
    """
    if metric not in ("top1_prob", "entropy", "kl"):
        raise ValueError(f"a generation heatmap colours by top1_prob, entropy or kl; got {metric!r}")
    names = shown(lens)
    grids = [Grid.from_generation(gen, name) for name in names]
    domain = domain_of(np.concatenate([g.metric_values(metric) for g in grids], axis=1), METRICS[metric])
    parts = [heatmap(g, metric, 0, settings, f"{LENS_TITLES[name]} while generating: top-1 at the newest token",
                     domain) for name, g in zip(names, grids)]
    chart = parts[0] if len(parts) == 1 else alt.vconcat(*parts, spacing=24).resolve_scale(color="shared")
    return finish(chart, settings, f"{lens}-generation")


def lens_table(result: LensResult, lens: str = "logit", settings: DisplaySettings = DisplaySettings(),
               start: int | None = None) -> pd.DataFrame:
    """The heatmap as text, for a screen reader: a row per layer (the top layer first, as drawn), a column
    per position the heatmap draws ("3: ␣Paris"), each cell "token (p=0.42)", with its rank where
    punctuation was skipped. Only the drawn window: a whole long prompt would be megabytes of HTML."""
    grid = Grid.from_lens(result, lens)
    cols = window_of(len(grid.column_tokens), start, settings)
    columns = [f"{pos}: {show_token(grid.column_tokens[pos])}" for pos in cols]
    rows = []
    for i in reversed(range(len(grid.layers))):
        row = []
        for c in cols:
            token, p, rank = grid.cell(i, c)
            note = "" if grid.shown is None or rank == 1 else (
                f", rank {rank}" if rank else f", no word in the top {grid.shown[3]}")
            row.append(f"{show_token(token)} (p={p:.2f}{note})")
        rows.append(row)
    return pd.DataFrame(rows, index=pd.Index(grid.layers[::-1], name="layer"), columns=columns)


def _range(cols: range, total: int) -> str:
    return "" if len(cols) == total else f" (positions {cols.start}–{cols.stop - 1} of {total})"


def _with_overview(chart, grid: Grid, metric: str, target: int, cols: range, s: DisplaySettings):
    """Above a windowed heatmap: every position, layers averaged in bands, the window at full strength."""
    n = len(grid.column_tokens)
    if len(cols) == n:
        return chart
    values = grid.metric_values(metric, target)
    bands = np.array_split(np.arange(len(grid.layers)), min(s.overview_bands, len(grid.layers)))
    m = METRICS[metric]
    dom = domain_of(values, m)
    rows = []
    for band in bands:
        with warnings.catch_warnings():         # positions a first look has not read yet are NaN: drawn blank
            warnings.simplefilter("ignore", RuntimeWarning)
            mean = np.nanmean(values[band], axis=0)
        label = f"{grid.layers[band[0]]}–{grid.layers[band[-1]]}"
        for pos in range(n):
            rows.append({"position": pos, "band": label, "value": finite(mean[pos]),
                         "shown": cols.start <= pos < cols.stop})
    scale = alt.Scale(scheme=s.scheme, domain=list(dom), type="log" if m.log else "linear", reverse=m.log)
    overview = alt.Chart(alt.Data(values=Rows(rows))).mark_rect().encode(
        x=alt.X("position:O", title=f"all {n} positions (the window is the bright part; move it with the slider)",
                axis=alt.Axis(values=list(range(0, n, 25)), labelAngle=0),
                scale=alt.Scale(domain=list(range(n)))),        # every position, read yet or not (blank)
        y=alt.Y("band:N", sort=[r["band"] for r in rows[::n]][::-1], title="layers"),
        color=alt.Color("value:Q", scale=scale, legend=None),
        opacity=alt.condition("datum.shown", alt.value(1.0), alt.value(0.3)),
        tooltip=["position:O", "band:N", alt.Tooltip("value:Q", format=".3~g")],
    ).properties(width=alt.Step(max(2, min(8, 1200 // n))), height=alt.Step(8), title="overview")
    return alt.vconcat(overview, chart, spacing=12).resolve_scale(color="independent")


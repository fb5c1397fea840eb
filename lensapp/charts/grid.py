"""The heatmap every chart draws: a `Grid` of layers x columns, its metrics and colours, as Altair.

Rows are layers with layer 0 at the bottom; columns are prompt positions (or generation steps),
labelled by their token. Repeated tokens get distinct labels by trailing zero-width spaces, so a
column is always one position. A grid can be a window of a longer one (`first` is the position of
its first column) and can be drawn after empty padding columns (to align prompts at their end):
padding has no cells, so it is never drawn as data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable

import altair as alt
import numpy as np

from ..lens_kinds import titles
from ..results import GenerationResult, LensResult
from .tokens import clip, column_labels, show_token

PAD = "\u2063"      # an invisible separator: padding columns' labels (unique by repetition, shown as nothing)
LENS_TITLES = titles()      # each declared lens's title (lens_kinds.py), by name


class Rows:
    """A chart's cells as its inline data (`alt.Data(values=Rows(rows))`), handed to Altair by reference. Altair's
    schema objects deep-copy their inline values at every layer and concatenation and walk them again to write
    them out: a streamed generation's pair of heatmaps (64 steps x 30 layers) took 0.8-2.8 s of the web process a
    redraw, most of it copying rows (bench/RESULTS.md, 2026-12-06). The rows are plain JSON already, and Altair
    writes an object that has a JSON schema type and `to_dict` (its `SchemaLike`) as that method returns it: the
    chart's JSON is the same."""

    _schema = {"type": "array"}

    def __init__(self, rows: list[dict]):
        self.rows = rows

    def to_dict(self, *args, **kwargs) -> list[dict]:
        return self.rows


@dataclass(frozen=True)
class DisplaySettings:
    scheme: str = "viridis"              # colour-blind-safe sequential scheme for every metric
    diverging_scheme: str = "blueorange"  # colour-blind-safe diverging scheme for differences
    cell_width: int = 58                 # px per token column
    cell_height: int = 20                # px per layer row
    max_cell_chars: int = 7              # top-1 text inside a cell, clipped with …
    max_label_chars: int = 14            # axis labels
    tooltip_k: int = 10                  # top-k entries a tooltip lists (k may be up to 100)
    font_size: int = 10
    renderer: str = "svg"                # svg keeps every cell a DOM node (readable by tests and screen readers)
    max_columns: int = 48                # a longer prompt is drawn as a window of this many positions
    overview_bands: int = 6              # rows of the long-prompt overview (layers averaged in bands)


@dataclass(frozen=True)
class Metric:
    title: str
    needs_target: bool = False
    log: bool = False                    # log colour scale (ranks)
    unit_interval: bool = False          # values in 0..1


METRICS = {
    "top1_prob": Metric("top-1 probability", unit_interval=True),
    "entropy": Metric("entropy (nats)"),
    "kl": Metric("KL to final (nats)"),
    "target_prob": Metric("target probability", needs_target=True, unit_interval=True),
    "target_rank": Metric("target rank", needs_target=True, log=True),
}


@dataclass
class Grid:
    """What a heatmap shows, independent of where it came from.

    layers [L]; columns [C] display tokens; top_tokens [L][C][k]; top_probs [L, C, k];
    entropy, kl [L, C]; targets: (text, probs [L, C], ranks [L, C]); first: position of column 0.
    shown: when punctuation is skipped, (tokens [L][C], ranks [L, C], probs [L, C], width searched): what
    each cell shows instead of its top-1 (rank 0: no word found, the top-1 is shown).
    """

    layers: list[int]
    column_kind: str                     # "position" | "step"
    column_tokens: list[str]
    top_tokens: list[list[list[str]]]
    top_probs: np.ndarray
    entropy: np.ndarray
    kl: np.ndarray
    targets: list[tuple[str, np.ndarray, np.ndarray]] = field(default_factory=list)
    first: int = 0
    shown: tuple | None = None

    @classmethod
    def from_lens(cls, result: LensResult, lens: str) -> Grid:
        r = result.lenses[lens]
        shown = None if r.display_ranks is None else (r.display_tokens, r.display_ranks, r.display_probs, r.searched)
        return cls(list(result.layers), "position", list(result.input_tokens), r.top_tokens, r.top_probs,
                   r.entropy, r.kl_to_final, [(t.text, *t.as_read()) for t in r.targets], shown=shown)

    @classmethod
    def from_generation(cls, gen: GenerationResult, lens: str) -> Grid:
        """Columns are steps: the newest position's readout, labelled by the token that step produced."""
        if not gen.steps:
            raise ValueError("the generation has no steps")
        reads = [s.readout.lenses[lens] for s in gen.steps]
        L = len(gen.steps[0].readout.layers)
        return cls(
            list(gen.steps[0].readout.layers), "step", [s.token for s in gen.steps],
            [[r.top_tokens[i][-1] for r in reads] for i in range(L)],
            np.stack([r.top_probs[:, -1] for r in reads], axis=1),
            np.stack([r.entropy[:, -1] for r in reads], axis=1),
            np.stack([r.kl_to_final[:, -1] for r in reads], axis=1),
        )

    def window(self, start: int, stop: int) -> Grid:
        """Columns start..stop-1 (positions keep their numbers)."""
        cols = slice(start, stop)
        return replace(self, column_tokens=self.column_tokens[cols],
                       top_tokens=[row[cols] for row in self.top_tokens], top_probs=self.top_probs[:, cols],
                       entropy=self.entropy[:, cols], kl=self.kl[:, cols],
                       targets=[(t, p[:, cols], r[:, cols]) for t, p, r in self.targets], first=self.first + start,
                       shown=None if self.shown is None else (
                           [row[cols] for row in self.shown[0]], self.shown[1][:, cols], self.shown[2][:, cols],
                           self.shown[3]))

    def cell(self, i: int, c: int) -> tuple[str, float, int]:
        """What cell (row i, column c) shows: (token, probability, rank); rank 1 is the top-1, 0 says that
        no word was found while skipping punctuation (the top-1 is shown)."""
        if self.shown is None:
            return self.top_tokens[i][c][0], float(self.top_probs[i, c, 0]), 1
        tokens, ranks, probs, _ = self.shown
        return tokens[i][c], float(probs[i, c]), int(ranks[i, c])

    def metric_values(self, metric: str, target: int = 0) -> np.ndarray:
        """[L, C] values of a METRICS key (target metrics read target number `target`)."""
        if metric == "top1_prob":
            return self.top_probs[..., 0]
        if metric == "entropy":
            return self.entropy
        if metric == "kl":
            return self.kl
        if metric in ("target_prob", "target_rank"):
            if not 0 <= target < len(self.targets):
                raise ValueError(f"metric {metric} needs a target; this result has {len(self.targets)}")
            _, probs, ranks = self.targets[target]
            return probs if metric == "target_prob" else ranks
        raise ValueError(f"unknown metric {metric!r}; choose from {sorted(METRICS)}")

    def metric_title(self, metric: str, target: int = 0) -> str:
        if metric == "target_prob":
            return f"P({show_token(self.target_text(target))})"
        if metric == "target_rank":
            return f"rank of {show_token(self.target_text(target))}"
        return METRICS[metric].title

    def target_text(self, target: int) -> str:
        text = self.targets[target][0]
        return text if text[:1].isspace() else " " + text


@dataclass(frozen=True)
class Highlight:
    """Cells a link's note points at: those in `layers` (any, when empty) whose shown token is one of
    `tokens` (any, when empty); nothing when both are empty."""

    layers: frozenset = frozenset()
    tokens: frozenset = frozenset()

    def __bool__(self) -> bool:
        return bool(self.layers or self.tokens)

    def marks(self, layer: int, token: str) -> bool:
        if not self:
            return False
        return ((not self.layers or layer in self.layers)
                and (not self.tokens or token in self.tokens or token.strip() in {t.strip() for t in self.tokens}))


SUPERSCRIPT = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")


def cell_text(token: str, rank: int, s: DisplaySettings) -> str:
    """A cell's text: its token, clipped; a word found below the top-1 carries its rank as a superscript."""
    if rank <= 1:
        return clip(show_token(token), s.max_cell_chars)
    mark = str(rank).translate(SUPERSCRIPT)
    return clip(show_token(token), s.max_cell_chars - len(mark)) + mark


def cell_rows(grid: Grid, values: np.ndarray, shade: np.ndarray, s: DisplaySettings,
              highlight: Highlight = Highlight(), href: Callable[[int, int, str], str] | None = None) -> list[dict]:
    """One row per cell; `href(layer, position, top-1 token)`, when given, is the link a click on the cell opens."""
    labels = column_labels(grid.column_tokens, s.max_label_chars)
    k = min(grid.top_probs.shape[-1], s.tooltip_k)
    rows = []
    for i, layer in enumerate(grid.layers):
        for c, label in enumerate(labels):
            top = grid.top_tokens[i][c]
            token, p, rank = grid.cell(i, c)
            row = {
                "layer": int(layer), grid.column_kind: grid.first + c, "column": label,
                "token": show_token(grid.column_tokens[c]),
                "top1": cell_text(token, rank, s),
                "value": finite(values[i, c]),
                "ink": "white" if shade[i, c] < 0.55 else "black",
                "noted": highlight.marks(int(layer), token),
            }
            if href is not None and grid.column_kind == "position":
                row["href"] = href(int(layer), grid.first + c, top[0])
            if grid.shown is not None:
                row["shown"] = (f"{show_token(token)}   {100 * p:.1f}% (skipping punctuation: rank {rank})" if rank
                                else f"no word in the top {grid.shown[3]}: showing #1")
            for j in range(k):
                row[f"t{j + 1}"] = f"{show_token(top[j])}   {100 * float(grid.top_probs[i, c, j]):.1f}%"
            rows.append(row)
    return rows


def finite(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def shade(values: np.ndarray, metric: Metric, domain: tuple[float, float]) -> np.ndarray:
    """Where each value falls on the colour ramp, 0 (dark) .. 1 (light): picks the text colour."""
    lo, hi = domain
    v = np.nan_to_num(values.astype(np.float64), nan=lo)
    if metric.log:
        v, lo, hi = np.log(np.clip(v, 1, None)), math.log(max(lo, 1)), math.log(max(hi, 1))
        return 1.0 - np.clip((v - lo) / (hi - lo or 1.0), 0, 1)     # rank 1 is the light end
    return np.clip((v - lo) / (hi - lo or 1.0), 0, 1)


def domain_of(values: np.ndarray, metric: Metric) -> tuple[float, float]:
    if metric.unit_interval:
        return 0.0, 1.0
    finite_values = values[np.isfinite(values)]
    hi = float(finite_values.max()) if finite_values.size else 1.0
    return (1.0, max(hi, 2.0)) if metric.log else (0.0, max(hi, 1e-6))


def heatmap(grid: Grid, metric: str, target: int, s: DisplaySettings, title: str,
            domain: tuple[float, float] | None = None, pad: int = 0, x_title: str | None = None,
            highlight: Highlight = Highlight(), href: Callable[[int, int, str], str] | None = None) -> alt.LayerChart:
    """One layer x column heatmap; `pad` empty columns before the first (their labels show nothing); the
    cells `highlight` marks are outlined; a click on a cell opens `href(layer, position, top-1 token)`."""
    values = grid.metric_values(metric, target)          # raises on an unknown metric or missing target
    m = METRICS[metric]
    domain = domain or domain_of(values, m)
    rows = cell_rows(grid, values, shade(values, m, domain), s, highlight, href)
    order = [PAD * (i + 1) for i in range(pad)] + column_labels(grid.column_tokens, s.max_label_chars)
    if x_title is None:
        x_title = "prompt tokens (position →)" if grid.column_kind == "position" else "generated token (step →)"
    x = alt.X("column:N", sort=order, scale=alt.Scale(domain=order), title=x_title,
              axis=alt.Axis(labelAngle=-40, labelAlign="right", labelLimit=120, labelFontSize=11))
    y = alt.Y("layer:O", sort="descending", title="layer", axis=alt.Axis(labelFontSize=11))
    scale = alt.Scale(scheme=s.scheme, domain=list(domain), type="log" if m.log else "linear", reverse=m.log)
    k = min(grid.top_probs.shape[-1], s.tooltip_k)
    tooltip = [alt.Tooltip("layer:O", title="layer"),
               alt.Tooltip(f"{grid.column_kind}:O", title=grid.column_kind),
               alt.Tooltip("token:N", title="input token" if grid.column_kind == "position" else "generated"),
               alt.Tooltip("value:Q", title=grid.metric_title(metric, target), format=".4~g")]
    if grid.shown is not None:
        tooltip.append(alt.Tooltip("shown:N", title="shown"))
    tooltip += [alt.Tooltip(f"t{j + 1}:N", title=f"#{j + 1}") for j in range(k)]
    base = alt.Chart().encode(x=x, y=y, tooltip=tooltip)
    rect = base.mark_rect(stroke="white", strokeWidth=0.5).encode(
        color=alt.Color("value:Q", scale=scale, title=grid.metric_title(metric, target),
                        legend=alt.Legend(orient="top", direction="horizontal", gradientLength=220, titleLimit=400)))
    if href is not None:
        rect = rect.encode(href="href:N")
    text = base.mark_text(fontSize=s.font_size, limit=s.cell_width - 4).encode(
        text="top1:N", color=alt.condition("datum.ink === 'white'", alt.value("white"), alt.value("black")))
    marks = [rect, text]
    if any(r["noted"] for r in rows):
        # White under black: an outline that shows on both ends of the colour scale.
        marks += [base.mark_rect(filled=False, stroke=colour, strokeWidth=width).transform_filter("datum.noted")
                  for colour, width in (("white", 5), ("black", 2.5))]
    return alt.layer(*marks, data=alt.Data(values=Rows(rows))).properties(
        width=alt.Step(s.cell_width), height=alt.Step(s.cell_height), title=title)


def finish(chart, s: DisplaySettings, filename: str):
    """Top-level settings: the export menu (PNG/SVG only: no data leaves the page; padding keeps its
    button off the title), fonts, no frame. Set on `chart` itself, a chart its maker has just built: Altair's
    `properties` and `configure_*` each make a copy, and a copy of a concatenation builds it again (its
    subcharts' parameters gathered, each subchart copied whole), a tenth of a streamed generation's chart making."""
    chart.padding = {"left": 5, "top": 5, "bottom": 5, "right": 40}
    chart.usermeta = {"embedOptions": {
        "renderer": s.renderer, "downloadFileName": filename,
        "actions": {"export": True, "source": False, "compiled": False, "editor": False},
    }}
    chart.config = alt.Config(view=alt.ViewConfig(strokeWidth=0), title=alt.TitleConfig(anchor="start", fontSize=13))
    return chart


def window_of(n: int, start: int | None, s: DisplaySettings) -> range:
    """The columns a chart of `n` columns draws: all of them, or `max_columns` from `start`
    (default: the last ones, where the next token is predicted)."""
    if n <= s.max_columns:
        return range(n)
    first = n - s.max_columns if start is None else min(max(0, int(start)), n - s.max_columns)
    return range(first, first + s.max_columns)

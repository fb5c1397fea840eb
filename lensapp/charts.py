"""Altair charts of lens results: layer x token heatmaps, a J-lens/logit-lens diff, target curves.

Each public function takes a `results` object and returns a finished Altair chart (what
`gr.Plot` shows and `chart.to_dict()` tests). Display choices live in `DisplaySettings`.
Nothing here runs a model or imports torch; it only arranges numbers already in a result.

Token text is data, never markup: Vega draws it as text (SVG text nodes, escaped tooltips),
and `show_token` makes invisible characters visible (` ` -> `␣`, newline -> `↵`, tab -> `⇥`).
Rows are layers with layer 0 at the bottom; columns are prompt positions (or generation steps),
labelled by their token. Repeated tokens get distinct labels by trailing zero-width spaces,
so a column is always one position.
"""

from __future__ import annotations

import math
import unicodedata
from dataclasses import dataclass, field

import altair as alt
import numpy as np
import pandas as pd

from .results import GenerationResult, LensResult

_GLYPHS = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍", "\x7f": "␡", "\xa0": "⍽"}
_ZWSP = "\u200b"


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


def show_token(text: str) -> str:
    """Token text with whitespace, control and format characters made visible ('' -> '∅').

    Other invisible characters (no-break and thin spaces, zero-width and bidi controls, which
    could also reorder a label) show as their code point: '⟨U+200B⟩'.
    """
    if text == "":
        return "∅"
    return "".join(_glyph(ch) for ch in text)


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

@dataclass
class Grid:
    """What a heatmap shows, independent of where it came from.

    layers [L]; columns [C] display tokens; top_tokens [L][C][k]; top_probs [L, C, k];
    entropy, kl [L, C]; targets: (text, probs [L, C], ranks [L, C]).
    """

    layers: list[int]
    column_kind: str                     # "position" | "step"
    column_tokens: list[str]
    top_tokens: list[list[list[str]]]
    top_probs: np.ndarray
    entropy: np.ndarray
    kl: np.ndarray
    targets: list[tuple[str, np.ndarray, np.ndarray]] = field(default_factory=list)

    @classmethod
    def from_lens(cls, result: LensResult, lens: str) -> Grid:
        r = result.lenses[lens]
        return cls(list(result.layers), "position", list(result.input_tokens), r.top_tokens, r.top_probs,
                   r.entropy, r.kl_to_final, [(t.text, t.probs, t.ranks) for t in r.targets])

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


def _cell_rows(grid: Grid, values: np.ndarray, shade: np.ndarray, s: DisplaySettings) -> list[dict]:
    labels = column_labels(grid.column_tokens, s.max_label_chars)
    k = min(grid.top_probs.shape[-1], s.tooltip_k)
    rows = []
    for i, layer in enumerate(grid.layers):
        for c, label in enumerate(labels):
            top = grid.top_tokens[i][c]
            row = {
                "layer": int(layer), grid.column_kind: c, "column": label,
                "token": show_token(grid.column_tokens[c]),
                "top1": clip(show_token(top[0]), s.max_cell_chars),
                "value": _finite(values[i, c]),
                "ink": "white" if shade[i, c] < 0.55 else "black",
            }
            for j in range(k):
                row[f"t{j + 1}"] = f"{show_token(top[j])}   {100 * float(grid.top_probs[i, c, j]):.1f}%"
            rows.append(row)
    return rows


def _finite(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def _shade(values: np.ndarray, metric: Metric, domain: tuple[float, float]) -> np.ndarray:
    """Where each value falls on the colour ramp, 0 (dark) .. 1 (light): picks the text colour."""
    lo, hi = domain
    v = np.nan_to_num(values.astype(np.float64), nan=lo)
    if metric.log:
        v, lo, hi = np.log(np.clip(v, 1, None)), math.log(max(lo, 1)), math.log(max(hi, 1))
        return 1.0 - np.clip((v - lo) / (hi - lo or 1.0), 0, 1)     # rank 1 is the light end
    return np.clip((v - lo) / (hi - lo or 1.0), 0, 1)


def _domain(values: np.ndarray, metric: Metric) -> tuple[float, float]:
    if metric.unit_interval:
        return 0.0, 1.0
    finite = values[np.isfinite(values)]
    hi = float(finite.max()) if finite.size else 1.0
    return (1.0, max(hi, 2.0)) if metric.log else (0.0, max(hi, 1e-6))


def _heatmap(grid: Grid, metric: str, target: int, s: DisplaySettings, title: str,
             domain: tuple[float, float] | None = None) -> alt.LayerChart:
    values = grid.metric_values(metric, target)          # raises on an unknown metric or missing target
    m = METRICS[metric]
    domain = domain or _domain(values, m)
    rows = _cell_rows(grid, values, _shade(values, m, domain), s)
    order = column_labels(grid.column_tokens, s.max_label_chars)
    x_title = "prompt tokens (position →)" if grid.column_kind == "position" else "generated token (step →)"
    x = alt.X("column:N", sort=order, title=x_title,
              axis=alt.Axis(labelAngle=-40, labelAlign="right", labelLimit=120, labelFontSize=11))
    y = alt.Y("layer:O", sort="descending", title="layer", axis=alt.Axis(labelFontSize=11))
    scale = alt.Scale(scheme=s.scheme, domain=list(domain), type="log" if m.log else "linear",
                      reverse=m.log)
    k = min(grid.top_probs.shape[-1], s.tooltip_k)
    tooltip = [alt.Tooltip("layer:O", title="layer"),
               alt.Tooltip(f"{grid.column_kind}:O", title=grid.column_kind),
               alt.Tooltip("token:N", title="input token" if grid.column_kind == "position" else "generated"),
               alt.Tooltip("value:Q", title=grid.metric_title(metric, target), format=".4~g")]
    tooltip += [alt.Tooltip(f"t{j + 1}:N", title=f"#{j + 1}") for j in range(k)]
    base = alt.Chart().encode(x=x, y=y, tooltip=tooltip)
    rect = base.mark_rect(stroke="white", strokeWidth=0.5).encode(
        color=alt.Color("value:Q", scale=scale, title=grid.metric_title(metric, target),
                        legend=alt.Legend(orient="top", direction="horizontal", gradientLength=220, titleLimit=400)))
    text = base.mark_text(fontSize=s.font_size, limit=s.cell_width - 4).encode(
        text="top1:N", color=alt.condition("datum.ink === 'white'", alt.value("white"), alt.value("black")))
    return alt.layer(rect, text, data=alt.Data(values=rows)).properties(
        width=alt.Step(s.cell_width), height=alt.Step(s.cell_height), title=title)


def _finish(chart, s: DisplaySettings, filename: str):
    """Top-level settings: the export menu (PNG/SVG only: no data leaves the page; padding keeps its
    button off the title), fonts, no frame."""
    return chart.properties(padding={"left": 5, "top": 5, "bottom": 5, "right": 40}, usermeta={"embedOptions": {
        "renderer": s.renderer, "downloadFileName": filename,
        "actions": {"export": True, "source": False, "compiled": False, "editor": False},
    }}).configure_view(strokeWidth=0).configure_title(anchor="start", fontSize=13)


# -- public charts --------------------------------------------------------------------------------

LENS_TITLES = {"logit": "logit lens", "jacobian": "Jacobian lens"}


def lens_heatmap(result: LensResult, lens: str = "logit", metric: str = "top1_prob", target: int = 0,
                 settings: DisplaySettings = DisplaySettings()):
    """Layers x prompt tokens; each cell the lens's top-1 token, coloured by `metric`."""
    grid = Grid.from_lens(result, lens)
    title = f"{LENS_TITLES[lens]}: top-1 token per layer and position"
    return _finish(_heatmap(grid, metric, target, settings, title), settings, f"{lens}-lens")


def lens_pair(result: LensResult, metric: str = "top1_prob", target: int = 0,
              settings: DisplaySettings = DisplaySettings()):
    """Jacobian lens and logit lens side by side over the same cells, on one colour scale."""
    grids = {lens: Grid.from_lens(result, lens) for lens in ("jacobian", "logit")}
    both = np.concatenate([g.metric_values(metric, target) for g in grids.values()], axis=1)
    domain = _domain(both, METRICS[metric])
    charts = [_heatmap(g, metric, target, settings, LENS_TITLES[lens], domain) for lens, g in grids.items()]
    return _finish(alt.hconcat(*charts, spacing=24).resolve_scale(color="shared"), settings, "jacobian-vs-logit")


def lens_diff(result: LensResult, settings: DisplaySettings = DisplaySettings()):
    """Cells where the two lenses' top-1 differ; colour: KL to final, logit lens minus J-lens.

    Positive (orange): the J-lens reads closer to the model's own output there.
    """
    j, lg = Grid.from_lens(result, "jacobian"), Grid.from_lens(result, "logit")
    labels = column_labels(j.column_tokens, settings.max_label_chars)
    delta = lg.kl - j.kl
    rows = []
    for i, layer in enumerate(j.layers):
        for c, label in enumerate(labels):
            tj, tl = j.top_tokens[i][c][0], lg.top_tokens[i][c][0]
            differ = tj != tl
            rows.append({
                "layer": int(layer), "position": c, "column": label, "token": show_token(j.column_tokens[c]),
                "differ": "differs" if differ else "same top-1",
                "delta": _finite(delta[i, c]) if differ else None,
                "top1": clip(show_token(tj), settings.max_cell_chars) if differ else "",
                "jlens": f"{show_token(tj)}   {100 * float(j.top_probs[i, c, 0]):.1f}%",
                "logit": f"{show_token(tl)}   {100 * float(lg.top_probs[i, c, 0]):.1f}%",
                "kl_j": _finite(j.kl[i, c]), "kl_l": _finite(lg.kl[i, c]),
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
    chart = alt.layer(agree, differ, text, data=alt.Data(values=rows)).properties(
        width=alt.Step(settings.cell_width), height=alt.Step(settings.cell_height),
        title="Where the lenses disagree: the J-lens top-1 is shown; empty grey cells agree")
    return _finish(chart, settings, "jacobian-logit-diff")


def target_curves(result: LensResult, lenses: tuple[str, ...] = ("logit",), position: int = -1,
                  settings: DisplaySettings = DisplaySettings()):
    """Each target's probability and rank across layers, at one position (default: the last).

    At the last position a multi-token target is scored whole (its continuation probability);
    elsewhere, and for the rank, by its first token.
    """
    rows = []
    pos = position % len(result.input_ids)
    last = pos == len(result.input_ids) - 1
    for lens in lenses:
        for t in result.lenses[lens].targets:
            whole = last and t.continuation_logprob is not None
            probs = np.exp(t.continuation_logprob) if whole else t.probs[:, pos]
            name = show_token(t.text) + (" (whole word)" if whole else "")
            for i, layer in enumerate(result.layers):
                rows.append({"layer": int(layer), "target": name, "lens": LENS_TITLES[lens],
                             "prob": _finite(probs[i]), "rank": int(t.ranks[i, pos])})
    if not rows:
        raise ValueError("the result has no targets")
    base = alt.Chart().encode(
        x=alt.X("layer:Q", title="layer", scale=alt.Scale(domain=[min(result.layers), max(result.layers)])),
        color=alt.Color("target:N", scale=alt.Scale(scheme="tableau10"), title="target"),
        strokeDash=alt.StrokeDash("lens:N", title="lens"),
        tooltip=["target:N", "lens:N", "layer:Q", alt.Tooltip("prob:Q", format=".4f"), "rank:Q"])
    prob = base.mark_line(point=True).encode(y=alt.Y("prob:Q", title="probability", scale=alt.Scale(domain=[0, 1])))
    rank = base.mark_line(point=True).encode(
        y=alt.Y("rank:Q", title="rank (1 = top, log)", scale=alt.Scale(type="log", reverse=True)))
    where = show_token(result.input_tokens[pos])
    chart = alt.hconcat(
        alt.layer(prob, data=alt.Data(values=rows)).properties(width=320, height=200, title=f"P(target) after {where}"),
        alt.layer(rank, data=alt.Data(values=rows)).properties(width=320, height=200,
                                                               title="rank of the target's first token"),
    )
    return _finish(chart, settings, "targets")


def generation_heatmap(gen: GenerationResult, lens: str = "logit", metric: str = "top1_prob",
                       settings: DisplaySettings = DisplaySettings()):
    """Layers x generation steps: each cell the lens's top-1 at the newest position of that step.

    Column s is labelled by the token the model produced at step s; a cell equal to its column
    label means that layer already said what the model went on to say.
    """
    if metric not in ("top1_prob", "entropy", "kl"):
        raise ValueError(f"a generation heatmap colours by top1_prob, entropy or kl; got {metric!r}")
    names = ("jacobian", "logit") if lens == "both" else (lens,)
    grids = [Grid.from_generation(gen, name) for name in names]
    domain = _domain(np.concatenate([g.metric_values(metric) for g in grids], axis=1), METRICS[metric])
    parts = [_heatmap(g, metric, 0, settings, f"{LENS_TITLES[name]} while generating: top-1 at the newest token",
                      domain) for name, g in zip(names, grids)]
    chart = parts[0] if len(parts) == 1 else alt.vconcat(*parts, spacing=24).resolve_scale(color="shared")
    return _finish(chart, settings, f"{lens}-generation")

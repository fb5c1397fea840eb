"""How good a lens is, drawn: hit rates across layers (results/evaluation.py).

Left, the intermediate: the share of items whose unspoken intermediate is within each lens's top 1 (dashed) and top
10 (solid) at each layer, the best band of hit@10 shaded in the lens's colour, and the control's hit@10 (dotted,
faint: another item's intermediate scored the same way; a lens reads this item's intermediate where its line
stands above the control's). Right, the target: the same rates for the word the model should say, for reference
(the last layer's is the model's own answer).
"""

from __future__ import annotations

from dataclasses import dataclass

import altair as alt

from ..results.evaluation import HIT_AT, EvaluationResult
from .grid import LENS_TITLES, DisplaySettings, finish


@dataclass(frozen=True)
class EvaluationDisplay:
    width: int = 320           # px per panel
    height: int = 200
    band_opacity: float = 0.12


def curve_rows(result: EvaluationResult) -> list[dict]:
    """One row per lens, layer, word (intermediate, control or target) and k: the hit rate."""
    rows = []
    for name, s in result.lenses.items():
        for k in HIT_AT:
            for word, rates in (("intermediate", s.hit_rate(k)), ("control", s.control_rate(k)),
                                ("target", s.target_rate(k))):
                rows += [{"lens": LENS_TITLES.get(name, name), "layer": int(layer), "word": word, "hit": f"hit@{k}",
                          "rate": round(float(rate), 5)} for layer, rate in zip(s.layers.tolist(), rates)]
    return rows


def band_rows(result: EvaluationResult, k: int = 10) -> list[dict]:
    """One row per lens that has a best band of hit@k: its first and last layer (half a layer out)."""
    rows = []
    for name, s in result.lenses.items():
        band = s.band(k)
        if band is not None:
            rows.append({"lens": LENS_TITLES.get(name, name), "from": band.first - 0.5, "to": band.last + 0.5,
                         "band": f"{band.first}-{band.last}", "best": band.best, "peak": round(band.rate, 5)})
    return rows


def evaluation_curves(result: EvaluationResult, display: EvaluationDisplay = EvaluationDisplay(),
                      settings: DisplaySettings = DisplaySettings()):
    """The intermediate's and the target's hit@1 and hit@10 across layers, per lens; the best bands shaded."""
    rows = curve_rows(result)
    if not rows:
        raise ValueError("the evaluation scored no lens")
    layers = [r["layer"] for r in rows]
    lenses = list(dict.fromkeys(r["lens"] for r in rows))
    colour = alt.Color("lens:N", scale=alt.Scale(scheme="tableau10", domain=lenses), title="lens")
    x = alt.X("layer:Q", title="layer", scale=alt.Scale(domain=[min(layers), max(layers)]))
    y = alt.Y("rate:Q", title="share of items", scale=alt.Scale(domain=[0, 1]), axis=alt.Axis(format="%"))
    dash = alt.StrokeDash("hit:N", title="hit", scale=alt.Scale(domain=[f"hit@{k}" for k in reversed(HIT_AT)],
                                                                 range=[[1, 0], [4, 3]]))
    tooltip = ["lens:N", "hit:N", "layer:Q", alt.Tooltip("rate:Q", format=".0%")]

    def lines(word: str):
        return alt.Chart(alt.Data(values=[r for r in rows if r["word"] == word])).mark_line(point=True).encode(
            x=x, y=y, color=colour, strokeDash=dash, tooltip=tooltip)

    control = alt.Chart(alt.Data(values=[r for r in rows if r["word"] == "control" and r["hit"] == "hit@10"]))
    panels = [control.mark_line(strokeDash=[2, 2], opacity=0.6).encode(
        x=x, y=y, color=colour, tooltip=["lens:N", alt.Tooltip("rate:Q", format=".0%", title="control hit@10"),
                                         "layer:Q"]), lines("intermediate")]
    bands = band_rows(result)
    if bands:
        panels.insert(0, alt.Chart(alt.Data(values=bands)).mark_rect(opacity=display.band_opacity).encode(
            x="from:Q", x2="to:Q", color=colour,
            tooltip=["lens:N", alt.Tooltip("band:N", title="best band (hit@10)"), "best:Q",
                     alt.Tooltip("peak:Q", format=".0%")]))
    size = {"width": display.width, "height": display.height}
    left = alt.layer(*panels).properties(title=[f"The intermediate read at the last position ({result.n_items} "
                                                f"{result.split} items)", "dotted: another item's (the control)"],
                                         **size)
    right = lines("target").properties(title="The target, for reference", **size)
    return finish(alt.hconcat(left, right).resolve_scale(color="shared"), settings, "lens-evaluation")

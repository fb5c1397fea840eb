"""The decision strip under a heatmap or a generation: where each token was decided (results/decided.py), under
the rule the page switches to, drawn from the result in hand (switching asks the engine for nothing), with a
per-prompt summary (how many settled, their mean layer, the latest-decided tokens).

`build_strip(prefix)` makes the components, by name (rule, strip, decided); `strip_of` fills them from a result,
`redraw_strip` is the handler of the rule (and a lens tab's window).
"""

from __future__ import annotations

import gradio as gr

from .. import charts
from ..results import GenerationResult
from ..results.decided import RULE_TITLES, summary
from .tabs import build_chart, int_or, md_text

RULES = [("top-1", "top1"), ("in the top 5", "top5"), ("p > 0.5", "p50")]

HOW_TO = ("**Decided at**: for each token, the first layer from which the lens reads it, and keeps reading it, up "
          "to the last layer (for a prompt, the token the model predicts there; for a generation, the token it "
          "wrote). Switch what *reads it* means: the top-1, anywhere in the top 5, or with probability above 0.5. "
          "An empty cell never settles: the lens's top-1 changes again above every layer.")


def build_strip(prefix: str) -> dict[str, gr.components.Component]:
    """The strip's components: the rule, the strip itself and the summary under it."""
    rule = gr.Radio(RULES, value="top1", label="Decided at: the first layer from which the token stays",
                    elem_id=f"{prefix}-rule", info=HOW_TO)
    strip = gr.Plot(elem_id=f"{prefix}-strip", elem_classes=["lens-plot"], show_label=False)
    text = gr.Markdown(elem_id=f"{prefix}-decided")
    return {"rule": rule, "strip": strip, "decided": text}


def draw_strip(result, rule, start=None):
    """(the strip, its summary) of a lens result or a generation; nothing for no result."""
    if result is None:
        return gr.skip(), gr.skip()
    rule = rule if rule in RULE_TITLES else "top1"
    return build_chart(charts.decision_strip, result, rule, start=start), strip_summary(result, rule)


def strip_of(result, rule, start=None) -> dict:
    """The strip and its summary by name (`build_strip`'s)."""
    strip, text = draw_strip(result, rule, start)
    return {"strip": strip, "decided": text}


def redraw_strip(guard, values: dict, request: gr.Request = None) -> dict:
    """The strip of the result in hand under the rule chosen, from the window's first position where there is
    one (no engine call)."""
    def redraw():
        if values["state"] is None:
            return {}
        start = values.get("window")
        return strip_of(values["state"], values["rule"], None if start is None else int_or(start, 0))
    return guard.ui(request, redraw)


def strip_summary(result, rule: str = "top1") -> str:
    """One line per lens: how many tokens settled, at what mean layer, and the three decided latest."""
    gen = isinstance(result, GenerationResult)
    lenses = result.lens_names if gen else list(result.lenses)
    lines = []
    for name in lenses:
        decided = result.decided_at(name, rule)
        tokens = list(result.tokens) if gen else result.decided_json(name)["decided_tokens"]
        s = summary(decided, tokens)
        what = "generated tokens" if gen else "positions"
        line = f"**{charts.LENS_TITLES[name]}** ({RULE_TITLES[rule]}): {s['decided']} of {len(decided)} {what} settle"
        if s["mean_layer"] is not None:
            line += f", at layer {s['mean_layer']:g} on average"
        if s["latest"]:
            where = "step" if gen else "position"
            latest = ", ".join(f"{md_text(charts.show_token(x['token']))} ({where} {x['position']}, layer {x['layer']})"
                               for x in s["latest"])
            line += f"; decided latest: {latest}"
        lines.append("- " + line)
    return "\n".join(lines)

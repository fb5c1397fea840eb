"""How good is this lens? A panel under the Jacobian-lens tab (service/evaluating.py, results/evaluation.py).

Every loaded lens is scored on the shipped two-hop items: does some layer read the unspoken intermediate (France
in "The capital of the country where the Eiffel Tower stands is") at the prompt's last position? A visitor picks
only the split: the items are the shipped ones, whose evaluation the service computes once per model and lens and
keeps (pinned in the result cache), so no click can ask for more work than that.

`build_evaluation_panel(prefix, service, guard)` makes and wires the components; `evaluate` is its handler.
"""

from __future__ import annotations

from functools import partial

import gradio as gr
import pandas as pd

from .. import charts
from ..charts.evaluation import evaluation_curves
from ..results.evaluation import HIT_AT, UNSPOKEN_READ
from ..service.requests import EvaluateRequest
from .tabs import build_chart, on

INTRO = ("A lens is worth reading when it shows what the model computes but does not say. On each shipped "
         "two-hop item, such as *The capital of the country where the Eiffel Tower stands is* (Paris, through the "
         "unspoken France), each lens is read at the prompt's last position at every layer: an item **hits** at a "
         "layer when a first token of the intermediate (␣France) is within the lens's top 1 (hit@1) or top 10 "
         "(hit@10). *Some layer*: the share of items that hit at any layer. *Best band*: the best layer and its "
         "neighbours within one standard error of its rate (with a few dozen items, layers that close cannot be "
         "told apart). *Control*: the same score for another item's intermediate (Italy on the France item): a "
         "lens that reads this prompt's intermediate, not just any country, stands above it. The held-out half "
         "was never tuned against; the items and how they were written: "
         "lensapp/assets/evaluations/README.md.")
SPLITS = [("Held-out half (report these)", "heldout"), ("Dev half", "dev"), ("All items", "all")]


def build_evaluation_panel(prefix: str, service, guard) -> dict[str, gr.components.Component]:
    """The panel's components, by name (each `eval_...`), its button wired to `evaluate`."""
    with gr.Accordion("How good is this lens?", open=False, elem_id=f"{prefix}-evaluation-box"):
        gr.Markdown(INTRO)
        with gr.Row():
            split = gr.Radio(SPLITS, value="heldout", label="Items", elem_id=f"{prefix}-evaluation-split", scale=3)
            run = gr.Button("Evaluate every lens", elem_id=f"{prefix}-evaluation-run", size="sm", scale=1)
        summary = gr.Dataframe(label="Per lens", interactive=False, wrap=True, elem_id=f"{prefix}-evaluation-summary")
        plot = gr.Plot(show_label=False, elem_classes=["lens-plot"], elem_id=f"{prefix}-evaluation-plot")
        with gr.Accordion("Per item", open=False):
            items = gr.Dataframe(interactive=False, wrap=True, elem_id=f"{prefix}-evaluation-items")
    parts = {"eval_split": split, "eval_run": run, "eval_summary": summary, "eval_plot": plot, "eval_items": items}
    on(run.click, partial(evaluate, service, guard), parts, ["eval_split"], ["eval_summary", "eval_plot", "eval_items"])
    return parts


def evaluate(service, guard, values: dict, request: gr.Request = None) -> dict:
    """The shipped items' evaluation for the chosen split, through the guard (a bad split: one line)."""
    return guard.ui(request, evaluation_view, service, values.get("eval_split"))


def evaluation_view(service, split) -> dict:
    result = service.evaluate(EvaluateRequest.parse(split=split))       # the shipped set: the only one a page asks
    return {"eval_summary": summary_table(result), "eval_plot": build_chart(evaluation_curves, result),
            "eval_items": item_table(result)}


def summary_table(result) -> pd.DataFrame:
    """One row per lens: the rates as percentages, the best bands, the target at the last layer."""
    df = result.summary()
    df["lens"] = [charts.LENS_TITLES.get(name, name) for name in df["lens"]]
    for column in [f"some layer hit@{k}" for k in HIT_AT] + ["control: some layer hit@10", "target top-1 at last layer",
                                                            "target top-10 at last layer"]:
        df[column] = [f"{x:.0%}" for x in df[column]]
    df[UNSPOKEN_READ] = ["–" if x is None or x != x else f"{x:.0%}" for x in df[UNSPOKEN_READ]]    # None: all said
    return df


def item_table(result) -> pd.DataFrame:
    """One row per item: the intermediate's best rank under each lens and at which layer, the target's last rank."""
    first = next(iter(result.lenses))
    df = result.item_frame(first)[["item", "intermediate", "target", "target rank at last layer"]]
    for name in result.lenses:
        per = result.item_frame(name)
        title = charts.LENS_TITLES.get(name, name)
        df[f"{title}: best rank"] = per["best rank"]
        df[f"{title}: at layer"] = per["at layer"]
    return df

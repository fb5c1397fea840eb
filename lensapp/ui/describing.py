"""Describe a cell in words, from a lens tab (Patchscopes: service/describing.py).

Under a heatmap: the position is the one the token table shows, the layer is typed (or every layer: a column
of descriptions beside the heatmap's column of tokens). The inputs are the describe request's own fields
(`DescribeRequest`: their labels, defaults and parsers); the answer is a table, one row per layer.

`build_describe_panel(prefix)` makes the components, by name; `describe` is the handler (`describe_cell` its work).
"""

from __future__ import annotations

import dataclasses

import gradio as gr
import pandas as pd

from .. import charts
from ..service import DescribeRequest
from ..service import fields as f
from ..service.describing import IDENTITY_PROMPT
from ..service.field import RequestError

INTRO = ("The lens says which token a cell is closest to; this asks the model what the cell *means*. The cell's "
         "hidden state replaces a placeholder in an inspection prompt (by default the identity prompt "
         f"*{IDENTITY_PROMPT}*: the model goes on to repeat what the state stands for), and the model writes a few "
         "tokens, greedily. *Every layer* describes the position's whole column at once.")


def build_describe_panel(prefix: str, n_layers: int) -> dict[str, gr.components.Component]:
    """The panel's components, by name (each `describe_...`)."""
    with gr.Accordion("Describe a cell in words (Patchscopes)", open=False, elem_id=f"{prefix}-describe-box"):
        gr.Markdown(INTRO)
        with gr.Row():
            layer = gr.Textbox(label=f"Layer (0..{n_layers - 1}, negative from the end)", value=str(2 * n_layers // 3),
                               elem_id=f"{prefix}-describe-layer", scale=1)
            tokens = gr.Slider(1, 32, value=f.DESCRIBE_TOKENS.default, step=1, label="Tokens to write",
                               elem_id=f"{prefix}-describe-tokens", scale=1)
            inspect_layer = gr.Number(label="Into layer (empty: the same)", value=f.INSPECT_LAYER.default, precision=0,
                                      elem_id=f"{prefix}-describe-into", scale=1)
        inspect = gr.Textbox(label="Inspection prompt (its last token is replaced)", value=f.INSPECT.default,
                             placeholder=IDENTITY_PROMPT, elem_id=f"{prefix}-describe-inspect")
        with gr.Row():
            one = gr.Button("Describe the cell at this position", elem_id=f"{prefix}-describe-run", size="sm")
            column = gr.Button("Every layer at this position", elem_id=f"{prefix}-describe-sweep", size="sm")
        table = gr.Dataframe(label="What the model says the cell holds", interactive=False, wrap=True,
                             elem_id=f"{prefix}-describe-table")
    return {"describe_layer": layer, "describe_max_tokens": tokens, "describe_inspect_layer": inspect_layer,
            "describe_inspect": inspect, "describe_one": one, "describe_column": column, "describe_table": table}


def describe(service, guard, every_layer: bool, values: dict, request: gr.Request = None) -> dict:
    """The cell at the token table's position described (or its whole column), through the guard."""
    return guard.ui(request, lambda: {"describe_table": describe_cell(
        service, values["state"], values["position"], values["chat"], values["describe_layer"],
        values["describe_max_tokens"], values["describe_inspect"], values["describe_inspect_layer"], every_layer)})


def describe_cell(service, result, position, chat, layer, max_tokens, inspect, inspect_layer, every_layer: bool):
    """The description(s) of the cell(s) at the token table's position in `result` (its prompt, as the lens read
    it: a BOS the Jacobian lens put first is not the prompt's own), as a table."""
    if result is None:
        raise gr.Error("Run the lens first: a cell is described from the readout on the page.")
    try:
        position = int(position)
    except (TypeError, ValueError):
        position = len(result.input_ids) - 1
    req = DescribeRequest.parse(prompt=result.prompt, layer="all" if every_layer else layer, position=0,
                                max_tokens=max_tokens, inspect=inspect, inspect_layer=inspect_layer, chat=chat)
    offset = len(result.input_ids) - len(service.prompts.ids(result.prompt, bool(req.chat)))
    if not 0 <= position - offset:
        raise RequestError("that position is the start-of-text token the Jacobian lens reads first, not the prompt's")
    answer = service.describe(dataclasses.replace(req, position=position - offset))
    return pd.DataFrame([{"layer": d.layer, "into layer": d.inspect_layer,
                          "token": charts.show_token(d.source_token), "the model says": d.text}
                         for d in answer.items])

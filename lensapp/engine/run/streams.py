"""The residual stream inside a trace: read after each block, edited on the way, and read between a block's
attention and its MLP.

Like `trace.py`'s bodies, which call these, they run inside an nnsight trace (on vLLM: in the engine's worker),
on envoys. The edits' math is `lensapp.interventions`'s; which rows a step's edit reaches, `interventions.edit_rows`.
"""

from __future__ import annotations

from typing import Callable

import torch

from ... import interventions
from .edit import Edit
from .families import Layout, find, first_item, residual
from .protocol import LensSpec
from .site import Site


def read_streams(model, site: Site, layers, edits: tuple[Edit, ...] = (), first: int = 0,
                 prompt_len: int = 0, inside: Callable | None = None) -> dict[int, torch.Tensor]:
    """{layer: the residual stream after block `layer`, [rows, d_model]} for each of `layers`, making
    `edits` on the way: for every layer of (layers | edit layers) in ascending order, that layer's edits
    (in their order), then its read, so a layer's read shows its edited stream.

    The step's rows are sequence positions first..first + rows - 1, of which the first prompt_len are the
    prompt's (see `interventions.edit_rows`): first is 0 for a forward over the prompt (or the prompt
    continued by a target), and the token's position for a generated one.

    Under pipeline parallelism, a stage edits only its own blocks, and reads its own (an earlier stage) or
    every layer (the last, where earlier ones arrive already edited): see `stages`.

    inside(layer), for each read layer: reads inside the block before its output is read, and returns a
    function given that output before any edit (`mid_reader`: the stream between attention and MLP).
    """
    blocks = find(model, site.layout.blocks)
    by_layer: dict[int, list[Edit]] = {}
    for edit in edits:
        by_layer.setdefault(edit.layer, []).append(edit)
    out, last = {}, site.last_stage()
    for layer in sorted(set(layers) | set(by_layer)):
        here = site.runs_here(blocks[layer])
        if not (here or last):
            continue
        finish = inside(layer) if inside is not None and layer in layers else None
        output = blocks[layer].output
        if finish is not None:
            finish(output)
        for edit in by_layer.get(layer, ()) if here else ():
            edit_block_output(output, site.layout, edit, first, prompt_len)
        if layer in layers:
            out[layer] = residual(output, site.layout).reshape(-1, site.d_model)
    return out


def edit_block_output(output, layout: Layout, edit: Edit, first: int, prompt_len: int) -> None:
    """Make `edit` on a block's output in place, where the next block reads it.

    vLLM's Llama-like blocks return (hidden, residual), the stream being their sum and the add fused
    into the next block's norm: the edit's delta (new - old stream) is added to `hidden`. Otherwise the
    stream is the output (or its first item; HF's has a batch dimension) and its rows are overwritten.
    """
    stream = residual(output, layout)                                   # [..., rows, d_model]
    rows, source = interventions.edit_rows(edit.positions, edit.generated, first, stream.shape[-2], prompt_len)
    if not rows:
        return
    index = torch.tensor(rows, device=stream.device)
    old = stream[..., index, :]
    flat = old.reshape(-1, stream.shape[-1])
    vector = edit.vector.to(stream.device)
    if edit.kind == "replace":
        vector = vector[torch.tensor(source, device=stream.device)]
    pairs = layout.pairs and output[1] is not None
    target = output[0] if isinstance(output, tuple) else output
    if pairs:
        target[..., index, :] += interventions.edit_delta(flat, edit.kind, vector, edit.value).reshape(old.shape)
    else:
        target[..., index, :] = interventions.apply_edit(flat, edit.kind, vector, edit.value).reshape(old.shape)


def step_rows(spec: LensSpec, step: int) -> dict:
    """read_streams' (first, prompt_len) for a generation's step: 0 the prompt, s >= 1 the s-th new token."""
    prompt_len = len(spec.input_ids)
    return {"first": 0 if step == 0 else prompt_len + step - 1, "prompt_len": prompt_len}


def mid_reader(model, site: Site, mlp_part: str):
    """(inside, mids) for `read_streams`: `inside(layer)` reads block `layer`'s MLP part before the
    block's output is read, and the function it returns takes that output and keeps the stream between the
    attention and the MLP, the output less the MLP's part, in `mids[layer]` ([tokens, d_model])."""
    blocks = find(model, site.layout.blocks)
    mids: dict[int, torch.Tensor] = {}

    def inside(layer: int):
        part = first_item(find(blocks[layer], mlp_part).output)

        def finish(output):
            stream = residual(output, site.layout).reshape(-1, site.d_model)
            mids[layer] = stream - part.reshape(-1, site.d_model)
        return finish
    return inside, mids

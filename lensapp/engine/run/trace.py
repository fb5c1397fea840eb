"""The trace bodies both backends run: read residuals, hand them to `lenses`, return small tensors.

These functions run inside an nnsight trace (on vLLM: in the engine's worker process), so they
see envoys, not tensors, until the forward reaches them. A backend passes its `Site`: where the
blocks, norm and head are (`families.Layout`), `head(model, x) -> logits`, the family's unembedding
with its logit arithmetic, and d_model. Everything vocab-wide stays here; only [layers, positions,
k]-sized tensors are returned.

Every trace saves one dict, under one name (`SAVED`), whose keys say what each value is: the
`*_trace` functions below build it, and the backends read it back by those keys.

Under pipeline parallelism every stage runs the body: an earlier stage reads (and edits) its own layers
and returns before the readout, and the last stage, where the head is, reads every layer (`stages`).

The residual stream inside a trace, which the bodies call to read (the module's last part): read after each
block, edited on the way, and read between a block's attention and its MLP. The edits' math is
`lensapp.interventions`'s; which rows a step's edit reaches, `interventions.edit_rows`.
"""

from __future__ import annotations

from typing import Callable

import torch

from ... import interventions, lenses
from ...lens_kinds import LOGIT, lens, reads_jlens
from .edit import Edit
from .families import Layout, final_norm, find, first_item, residual
from .protocol import LensSpec
from .site import Site
from .unembed_pool import UnembedPool

JLENS_ATTR = "lensapp_jlens"   # attribute on the (worker's) model holding {"layers": [...], "J": [n, d, d]}
SAVED = "saved"                # the one name every trace saves its dict under: `saved = nnsight.save(...)`


def installed_jlens(model, spec: LensSpec) -> dict | None:
    """The J stack installed on the model (`JLENS_ATTR`), when the spec reads a lens through it."""
    return getattr(model._module, JLENS_ATTR, None) if reads_jlens(spec.lenses) else None


def lens_input(name: str, h: torch.Tensor) -> torch.Tensor:
    """h [L, P, d_model] as lens `name` reads it: its declared transform, if any (lens_kinds.py)."""
    transform = lens(name).transform
    return h if transform is None else transform(h)


def lens_stack(name: str, jlens: dict | None, rows) -> torch.Tensor | None:
    """The J rows lens `name` transports the requested layers by (None: it reads no J)."""
    return select_rows(jlens["J"], rows) if lens(name).reads_jlens else None


def installed_layers(module) -> list[int]:
    """The Jacobian layers installed on a (worker's) torch model: what a worker's RPC reports."""
    return list((getattr(module, JLENS_ATTR, None) or {}).get("layers", []))


def model_logits(model, site: Site) -> torch.Tensor:
    """The model's own logits at the last position [vocab], read the way this site's backend has them."""
    return site.logits(model, site.layout)


def lens_trace(model, site: Site, spec: LensSpec) -> dict:
    """A prompt's trace: {"readouts": {lens: Readout [L, P, ...]}, "model_next_id": int}, and when the spec
    asks, "kept" [len(keep_layers), positions, d_model] and "norms" [len(spec.layers)] (float32). The readouts
    cover positions spec.read_from.. only (P = prompt length - read_from): the rest are never unembedded."""
    inside, mids = mid_reader(model, site, spec.after_attention) if spec.after_attention else (None, {})
    streams = read_streams(model, site, sorted(set(spec.read_layers) | set(spec.keep_layers)), spec.edits,
                           prompt_len=len(spec.input_ids), inside=inside)
    if not site.last_stage():
        return {}
    read = slice(spec.read_from, None)
    saved = {"readouts": lens_readouts(model, spec, site, torch.stack([streams[x][read] for x in spec.read_layers]))}
    if spec.after_attention:
        saved["after_attention"] = after_attention_readouts(model, spec, site, {x: m[read] for x, m in mids.items()},
                                                            streams[spec.read_layers[-1]][read])
    saved["model_next_id"] = int(model_logits(model, site).argmax())
    if spec.keep_layers:
        kept = torch.stack([streams[x] for x in spec.keep_layers])
        if spec.keep_positions is not None:
            kept = kept.index_select(1, torch.tensor(spec.keep_positions, device=kept.device))
        saved["kept"] = kept.float()
    if spec.norms:
        saved["norms"] = interventions.typical_norm(torch.stack([streams[x] for x in spec.layers]))
    return saved


def after_attention_readouts(model, spec: LensSpec, site: Site, mids: dict, final_h: torch.Tensor) -> dict:
    """{"logit": readout fields [L, P, ...]}: the logit lens at each requested layer's stream between its
    attention and its MLP (`mids`), against the model's own final distribution (the last layer's stream)."""
    unembed = (lambda x: raw_logits(model, site, x)) if spec.raw else (lambda x: site.head(model, x))
    norm = final_norm(model, site.layout)
    final = lenses.FinalDistribution.from_logits(unembed(norm(final_h)).float())
    target_ids = torch.tensor(spec.target_ids, dtype=torch.long, device=final_h.device) if spec.target_ids else None
    h = torch.stack([mids[layer] for layer in spec.layers])
    return {LOGIT.name: lenses.layer_readouts(h, norm, unembed, spec.k, final=final, target_ids=target_ids)}


def continuation_trace(model, site: Site, spec: LensSpec, index: int) -> dict:
    """The trace of prompt + target[:-1]: {"logprobs": {lens: log P(target | prompt) [L]}}."""
    return {"logprobs": continuation_body(model, spec, site, index)}


def lens_body(model, spec: LensSpec, site: Site, own_logits: bool = False, pool: UnembedPool | None = None,
              step: int = 0) -> dict:
    """{lens: readout fields [L, P, ...]} for one step of a generation (step 0: the prompt, from position
    spec.read_from), the spec's edits made as it reads (see `read_streams`)."""
    streams = read_streams(model, site, spec.read_layers, spec.edits, **step_rows(spec, step))
    if not site.last_stage() or (step == 0 and not spec.read_prompt):    # the prompt is read apart (`parts`)
        return {}
    h = torch.stack([streams[x] for x in spec.read_layers])
    if step == 0 and spec.read_from:
        h = h[:, spec.read_from:]
    return lens_readouts(model, spec, site, h, own_logits=own_logits, pool=pool)


def lens_readouts(model, spec: LensSpec, site: Site, h: torch.Tensor, own_logits: bool = False,
                  pool: UnembedPool | None = None) -> dict:
    """h [len(read_layers), P, d_model] -> {lens: readout fields [L, P, ...]}. The last layer is always
    read: its lens is the model's own distribution, the reference for KL.

    `own_logits`: the trace computes the model's logits at the last position anyway (vLLM, to sample);
    for a one-position step (every generated token after the first) they are the final distribution,
    which saves one full-vocab unembedding per step (~7 ms of ~60 for SmolLM2 on this CPU).
    `pool`: on such steps, unembed together with every other generation in the same step
    (see `unembed_pool`).
    """
    layout, head, jlens = site.layout, site.head, installed_jlens(model, spec)
    norm = final_norm(model, layout)
    unembed = (lambda x: raw_logits(model, site, x)) if spec.raw else (lambda x: head(model, x))
    hs = h.index_select(0, torch.tensor(spec.rows, device=h.device))
    target_ids = torch.tensor(spec.target_ids, dtype=torch.long, device=h.device) if spec.target_ids else None
    Js = {name: lens_stack(name, jlens, spec.jlens_rows) for name in spec.lenses}
    one_step = own_logits and not spec.raw and h.shape[1] == 1
    if one_step and pool is not None:
        # submit before waiting on the logits: every request in this step submits before any takes
        ticket = pool.submit(torch.cat([lenses.lens_inputs(lens_input(name, hs), norm, Js[name])
                                        for name in spec.lenses]))
        final_logits = model.logits[-1:].float()
        logits = pool.take(ticket, unembed).reshape(len(spec.lenses), hs.shape[0], 1, -1)
        final = lenses.FinalDistribution.from_logits(final_logits)
        out = {name: lenses.readouts_from_logits(logits[i], spec.k, final=final, target_ids=target_ids)
               for i, name in enumerate(spec.lenses)}
    else:
        final_logits = model.logits[-1:].float() if one_step else unembed(norm(h[-1])).float()
        final = lenses.FinalDistribution.from_logits(final_logits)
        out = {name: lenses.layer_readouts(lens_input(name, hs), norm, unembed, spec.k, final=final, J=Js[name],
                                           target_ids=target_ids)
               for name in spec.lenses}
    return out


def continuation_body(model, spec: LensSpec, site: Site, index: int) -> dict:
    """On prompt + target[:-1] (spec.continuations[index]): {lens: log P(target | prompt) [L]}."""
    cont = spec.continuations[index]
    n = len(cont.target_ids)
    layout, head, jlens = site.layout, site.head, installed_jlens(model, spec)
    streams = read_streams(model, site, spec.layers, spec.edits, prompt_len=len(spec.input_ids))
    if not site.last_stage():
        return {}
    h = torch.stack([streams[x] for x in spec.layers])[:, cont.start:cont.start + n]
    norm = final_norm(model, layout)
    unembed = (lambda x: raw_logits(model, site, x)) if spec.raw else (lambda x: head(model, x))
    ids = torch.tensor(cont.target_ids, dtype=torch.long, device=h.device)
    out = {}
    for name in spec.lenses:
        out[name] = lenses.continuation_logprob(lens_input(name, h), norm, unembed, ids,
                                                J=lens_stack(name, jlens, spec.jlens_rows))
    return out


def chat_readout(model, site: Site, layer: int, jrow: int | None, k: int, name: str):
    """The newest position's top-k at one layer through lens `name` (jrow: the installed J stack's row, for a
    lens that reads through it): (ids [k], probs [k])."""
    streams = read_streams(model, site, [layer])
    if not site.last_stage():           # a placeholder: the last stage's readout is the one kept
        return torch.zeros(k, dtype=torch.long), torch.zeros(k)
    h = lens_input(name, streams[layer][-1:].unsqueeze(0))[0]
    if jrow is not None:
        h = lenses.transport(h, getattr(model._module, JLENS_ATTR)["J"][jrow])
    top = lenses.readout(site.head(model, final_norm(model, site.layout)(h)).float(), k)
    return top["top_ids"][0], top["top_probs"][0]


def select_rows(stack: torch.Tensor, rows) -> torch.Tensor:
    """stack[rows], as a view when the rows are a contiguous run (the common case: no 20 MB copy)."""
    rows = list(rows)
    if rows == list(range(rows[0], rows[-1] + 1)):
        return stack[rows[0]:rows[-1] + 1]
    return stack.index_select(0, torch.tensor(rows, device=stack.device))


def raw_logits(model, site: Site, x: torch.Tensor) -> torch.Tensor:
    """norm(h) @ W_U.T with no family arithmetic (no soft-capping or logit scale); the whole vocab, gathered
    the way the backend's own head would (`site.gather`)."""
    logits = x @ find(model, site.layout.head).weight.T.to(x.dtype)
    return site.gather(model, logits) if site.gather is not None else logits


# -- the residual stream inside a trace: read after each block, edited on the way, read inside a block ------

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

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
"""

from __future__ import annotations

import torch

from ... import interventions, lenses
from ...lens_kinds import LOGIT, lens, reads_jlens
from .families import final_norm, find
from .protocol import LensSpec
from .site import Site
from .streams import mid_reader, read_streams, step_rows
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

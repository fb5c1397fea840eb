"""Edits inside the trace on the transformers backend (the tiny random Llama), against HF's own forward with
forward hooks making the same edits by hand: the kept streams, the readouts, the model's next token, the
continuations and greedy generations must be the hooked model's."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import AutoModelForCausalLM

from lensapp import config
from lensapp.engine.run.edit import Edit
from lensapp.engine.run.protocol import Sampling
from lensapp.service import LensService, planning

PROMPT = "The capital of France is a city on the river"
TARGETS = [11, 500, 7042]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    service = LensService.start(config.Config.of(model=str(tiny_model_dir), backend="transformers", jlens="none",
                                              cache_entries=0))
    service.wait_ready(300)
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    yield service, hf
    service.close()


def by_hand(h: torch.Tensor, edit: Edit, first: int, prompt_len: int) -> torch.Tensor:
    """The edit written out row by row on the rows h [R, d] of positions first.. (a copy), independent of
    `interventions`: explicit positions where they fall in this forward, else every prompt position, and
    every later position for a generated edit."""
    h, R = h.clone(), h.shape[0]
    if edit.positions is not None:
        rows = [(p - first, j) for j, p in enumerate(edit.positions) if first <= p < first + R]
    else:
        rows = [(p - first, p) for p in range(first, first + R) if p < prompt_len or edit.generated]
    for r, j in rows:
        s, v = h[r].clone(), edit.vector
        if edit.kind == "add":
            h[r] = s + v
        elif edit.kind == "project_out":
            u = v / v.norm()
            h[r] = s - (s @ u) * u
        elif edit.kind == "set_component":
            u = v / v.norm()
            h[r] = s + (edit.value - s @ u) * u
        else:
            h[r] = v[j]
    return h


def hooked(hf, edits, prompt_len: int, record: dict | None = None):
    """Forward hooks on every block making `edits` by hand (`by_hand`); a generation's forwards follow
    each other (the prompt, then one position each)."""
    handles, where = [], {"next": 0, "first": 0}

    def hook(layer):
        def run(module, args, out):
            h = out[0] if isinstance(out, tuple) else out          # [1, rows, d]
            if layer == 0:
                where["first"], where["next"] = where["next"], where["next"] + h.shape[1]
            x = h[0]
            for e in (e for e in edits if e.layer == layer):
                x = by_hand(x, e, where["first"], prompt_len)
            if record is not None:
                record.setdefault(layer, []).append(x.clone())
            return x[None] if not isinstance(out, tuple) else (x[None], *out[1:])
        return run

    for layer, block in enumerate(hf.model.layers):
        handles.append(block.register_forward_hook(hook(layer)))
    return handles


def reference(hf, ids, edits, prompt_len=None):
    """(streams {layer: [P, d]}, logits [P, vocab]) of HF's forward with the edits made by hooks."""
    record = {}
    handles = hooked(hf, edits, prompt_len or len(ids), record)
    try:
        with torch.no_grad():
            logits = hf(torch.tensor([ids])).logits[0]
    finally:
        for h in handles:
            h.remove()
    return {layer: r[0] for layer, r in record.items()}, logits


def spec_for(service, ids, layers, edits=(), **kw):
    n = service.info.n_layers
    spec = planning.lens_spec(ids, layers, 5, ("logit",), n, [], target_ids=kw.pop("target_ids", ()))
    return dataclasses.replace(spec, edits=tuple(edits), **kw)


def some_edits(d: int, P: int) -> list[list[Edit]]:
    g = torch.Generator().manual_seed(1)
    v = lambda: torch.randn(d, generator=g) * 3            # noqa: E731
    return [
        [Edit(layer=1, kind="add", vector=v(), positions=(1, 3))],
        [Edit(layer=2, kind="project_out", vector=v())],
        [Edit(layer=0, kind="set_component", vector=v(), value=4.0)],
        [Edit(layer=2, kind="replace", vector=torch.randn(2, d, generator=g), positions=(P - 1, 0))],
        [Edit(layer=1, kind="add", vector=v()), Edit(layer=1, kind="project_out", vector=v()),   # in order
         Edit(layer=3, kind="add", vector=v(), positions=(P - 1,))],
    ]


def test_edited_readouts_are_the_hooked_models(tiny):
    service, hf = tiny
    ids = service.prompts.ids(PROMPT)
    n, d, P = service.info.n_layers, service.info.d_model, len(ids)
    final_norm, head = hf.model.norm, hf.lm_head
    plain_streams, _ = reference(hf, ids, [])
    for edits in some_edits(d, P):
        spec = spec_for(service, ids, [0, 2, n - 1], edits, keep_layers=tuple(range(n)), norms=True,
                        target_ids=[[t] for t in TARGETS])
        out = service.engine.lens([spec])[0]
        streams, logits = reference(hf, ids, edits)
        assert out.kept.shape == (n, P, d)
        for layer in range(n):
            torch.testing.assert_close(out.kept[layer], streams[layer], atol=1e-5, rtol=1e-5)
        assert any(not torch.allclose(streams[x], plain_streams[x]) for x in range(n))   # the edit did something
        assert out.model_next_id == int(logits[-1].argmax())
        r = out.readouts["logit"]
        for row, layer in enumerate(spec.layers):
            want = head(final_norm(streams[layer])).softmax(-1)[:, TARGETS]
            torch.testing.assert_close(r["target_probs"][row], want, atol=1e-6, rtol=1e-4)
        by_layer = torch.stack([streams[x] for x in spec.layers])
        torch.testing.assert_close(out.norms, by_layer[:, 1:].norm(dim=-1).median(dim=-1).values, atol=1e-4,
                                   rtol=1e-5)


def test_kept_positions_and_an_edit_at_a_layer_not_read(tiny):
    service, hf = tiny
    ids = service.prompts.ids(PROMPT)
    n, d = service.info.n_layers, service.info.d_model
    edit = Edit(layer=1, kind="add", vector=torch.full((d,), 0.7))
    out = service.engine.lens([spec_for(service, ids, [n - 1], [edit], keep_layers=(2, 0), keep_positions=(4, 2))])[0]
    streams, _ = reference(hf, ids, [edit])
    torch.testing.assert_close(out.kept, torch.stack([streams[2][[4, 2]], streams[0][[4, 2]]]), atol=1e-5, rtol=0)


def test_continuations_edit_the_target_tokens_only_for_generated_edits(tiny):
    service, hf = tiny
    ids = service.prompts.ids(PROMPT)
    target = service.prompts.tokenizer(" the Seine in Paris", add_special_tokens=False)["input_ids"]
    n, d, P = service.info.n_layers, service.info.d_model, len(ids)
    for generated in (False, True):
        edit = Edit(layer=2, kind="add", vector=torch.linspace(-2, 2, d), generated=generated)
        out = service.engine.lens([spec_for(service, ids, [n - 1], [edit], target_ids=[target])])[0]
        _, logits = reference(hf, ids + target[:-1], [edit], prompt_len=P)
        log_p = logits.log_softmax(-1)
        want = sum(float(log_p[P - 1 + i, t]) for i, t in enumerate(target))
        assert abs(float(out.continuations[0]["logit"][-1]) - want) < 1e-4, generated


@pytest.mark.parametrize("edit_kw", [{"positions": None, "generated": True}, {"positions": (2, 5)}])
def test_generation_with_edits_is_the_hooked_models_greedy_generation(tiny, edit_kw):
    service, hf = tiny
    ids = service.prompts.ids(PROMPT)
    n, d = service.info.n_layers, service.info.d_model
    edit = Edit(layer=1, kind="add", vector=torch.linspace(-3, 3, d), **edit_kw)
    spec = spec_for(service, ids, [1, n - 1], [edit])
    got = service.engine.generate(spec, Sampling(max_tokens=5))
    plain = service.engine.generate(spec_for(service, ids, [1, n - 1]), Sampling(max_tokens=5))
    handles = hooked(hf, [edit], len(ids))
    try:
        with torch.no_grad():
            want = hf.generate(torch.tensor([ids]), max_new_tokens=5, do_sample=False,
                               pad_token_id=service.prompts.tokenizer.eos_token_id)[0, len(ids):].tolist()
    finally:
        for h in handles:
            h.remove()
    assert got.token_ids == want
    assert got.token_ids != plain.token_ids or got.steps[0]["logit"]["top_probs"].ne(
        plain.steps[0]["logit"]["top_probs"]).any()
    assert [int(s["logit"]["top_ids"][-1, -1, 0]) for s in got.steps] == got.token_ids


def test_the_chat_readout_refuses_edits(tiny):
    service, _ = tiny
    ids = service.prompts.ids(PROMPT)
    spec = spec_for(service, ids, [1], [Edit(layer=1, kind="add", vector=torch.zeros(service.info.d_model))])
    with pytest.raises(ValueError, match="chat readout takes no edits"):
        service.engine.chat(spec, Sampling(max_tokens=2))

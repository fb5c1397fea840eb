"""issue 28's charts from hand-built results: the decision strip, the tokens followed when no target is given, and
where two branches part."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lensapp import charts
from lensapp.results import GenerationResult, GenerationStep, LensReadout, LensResult


def column(ids_by_layer: list[list[int]], probs_by_layer: list[list[float]]) -> LensReadout:
    """One position's readout, [L][k] ids and probabilities."""
    ids = np.array(ids_by_layer)[:, None, :]
    probs = np.array(probs_by_layer, dtype=np.float32)[:, None, :]
    return LensReadout(top_ids=ids, top_probs=probs, top_tokens=[[[f"w{i}" for i in row]] for row in ids_by_layer],
                       entropy=np.zeros((len(ids), 1), np.float32), kl_to_final=np.zeros((len(ids), 1), np.float32))


def result(readout: LensReadout, token="x") -> LensResult:
    L = readout.top_ids.shape[0]
    return LensResult(prompt=token, input_ids=[0], input_tokens=[token], layers=list(range(L)),
                      lenses={"logit": readout}, model_next_id=0, model_next_token="")


IDS = [[1, 2, 3], [2, 1, 3], [3, 2, 1], [3, 1, 2], [1, 3, 4]]
PROBS = [[0.5, 0.3, 0.1], [0.4, 0.3, 0.2], [0.6, 0.2, 0.1], [0.5, 0.3, 0.1], [0.7, 0.2, 0.05]]


def test_with_no_target_the_curves_follow_every_top1_most_probable_first():
    r = result(column(IDS, PROBS))
    assert r.top1_tokens("logit", 0) == [1, 3, 2]          # by the last layer's p: 0.7, 0.2, absent (0)
    assert r.top1_tokens("logit", 0, cap=2) == [1, 3]
    rows = charts.top1_curves(r, position=0).to_dict()["hconcat"][0]["data"]["values"]
    assert [x["target"] for x in rows if x["layer"] == 4] == ["w1", "w3"]       # w2 left the top-3 at layer 4
    w2 = [(x["layer"], x["rank"]) for x in rows if x["target"] == "w2"]
    assert w2 == [(0, 2), (1, 1), (2, 2), (3, 3)]
    assert {x["run"] for x in rows if x["target"] == "w1"} == {"logit:1:0"}     # in the top-3 throughout: one line
    spec = charts.top1_curves(r, position=0).to_dict()
    assert spec["hconcat"][0]["layer"][0]["encoding"]["detail"]["field"] == "run"


def test_the_strip_says_where_each_position_settled():
    r = result(column(IDS, PROBS))           # the final top-1 is 1: top-1 at layer 4 only
    strip = charts.decision_strip(r).to_dict()
    assert [(x["lens"], x["text"], x["decided"]) for x in strip["data"]["values"]] == [("logit lens", "4", "w1")]
    assert [m["mark"]["type"] for m in strip["layer"]] == ["rect", "rect", "text"]     # never, decided, its layer
    assert "p > 0.5" in charts.decision_strip(r, "p50").to_dict()["title"]
    with pytest.raises(ValueError, match="unknown rule"):
        charts.decision_strip(r, "top2")


def generation(tokens: list[int], tops: list[int]) -> GenerationResult:
    """A generation whose step s reads top-1 `tops[s]` at every one of 3 layers, the last layer `tokens[s]`."""
    steps = []
    for tok, top in zip(tokens, tops):
        ids = [[top, tok, 9], [top, tok, 9], [tok, top, 9]]
        readout = result(column(ids, [[0.6, 0.3, 0.1]] * 3), token=f"w{tok}")
        raw = {"top_ids": torch.tensor(readout.lenses["logit"].top_ids),
               "top_probs": torch.tensor(readout.lenses["logit"].top_probs),
               "entropy": torch.zeros(3, 1), "kl_to_final": torch.zeros(3, 1)}
        readout.lenses["logit"] = LensReadout.from_readout(raw, lambda xs: [f"w{i}" for i in xs], next_ids={0: tok})
        steps.append(GenerationStep(token_id=tok, token=f"w{tok}", readout=readout))
    return GenerationResult(prompt="p", text="", token_ids=tokens, tokens=[f"w{t}" for t in tokens], steps=steps)


def test_a_generation_strip_and_where_two_branches_part():
    a, b = generation([5, 6, 7], [5, 6, 7]), generation([5, 8, 7], [5, 6, 1])
    assert a.decided_at("logit") == [0, 0, 0] and b.decided_at("logit") == [0, 2, 2]
    assert a.to_json()["decided_at"] == {"logit": [0, 0, 0]}
    rows = charts.decision_strip(b).to_dict()["data"]["values"]
    assert [x["text"] for x in rows] == ["0", "2", "2"] and rows[1]["token"] == "w8"
    spec = charts.branch_divergence(a, b).to_dict()
    cells = spec["data"]["values"]
    assert {x["step"] for x in cells} == {1, 2}
    assert [(x["step"], x["layer"]) for x in cells if x["differs"] == "differs"] == [(1, 2), (2, 0), (2, 1)]
    with pytest.raises(ValueError, match="nothing parts"):
        charts.branch_divergence(a, a)

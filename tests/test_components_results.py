"""ComponentsResult from hand-built engine output: the JSON contract (string keys only), the sums, the frames and
the CSV; and a lens result read with sublayers."""

import json

import numpy as np
import orjson
import pandas as pd
import pytest
import torch

from lensapp.engine.run.protocol import ComponentsOutput
from lensapp.results import ComponentsResult, Target

TOKENS = ["The", " capital", " of", " France", " is"]


def output(L=3, H=2, k=3, P=5, pattern=True, seed=0) -> ComponentsOutput:
    g = torch.Generator().manual_seed(seed)
    attn_bias = torch.randn(L, generator=g)
    heads = torch.randn(L, H, generator=g)
    weights = torch.softmax(torch.randn(H, P, P, generator=g).masked_fill(torch.ones(P, P).triu(1).bool(), -1e9), -1)
    top = torch.randn(L, H, P, generator=g).softmax(-1).topk(k, -1)
    embed, mlp, bias = torch.randn((), generator=g), torch.randn(L, generator=g), torch.tensor(0.25)
    attn = heads.sum(1) + attn_bias
    return ComponentsOutput(logit=embed + attn.sum() + mlp.sum() + bias + 1e-7, embed=embed, attn=attn, mlp=mlp,
                            heads=heads, attn_bias=attn_bias, bias=bias, sigma=torch.tensor(3.0),
                            top_positions=top.indices, top_weights=top.values, pattern=weights if pattern else None)


def pattern_frame(r: ComponentsResult) -> pd.DataFrame:
    """The pattern as rows (head, query, key, weight), each query's keys up to itself."""
    H, P, _ = r.pattern.shape
    h, q, k = np.meshgrid(range(H), range(P), range(P), indexing="ij")
    keep = (k <= q).ravel()
    return pd.DataFrame({"head": h.ravel()[keep], "query": q.ravel()[keep], "key": k.ravel()[keep],
                         "weight": r.pattern.ravel()[keep]})


def result(pattern=True, foil=True, position=4) -> ComponentsResult:
    out = output(P=position + 1, pattern=pattern)
    return ComponentsResult.from_output(out, prompt="The capital of France is", ids=[1, 2, 3, 4, 5][:len(TOKENS)],
                                        position=position, target=Target("Paris", (10, 11)),
                                        foil=Target("Rome", (12,)) if foil else None,
                                        decode=lambda ids: [({10: " Paris", 12: " Rome"}.get(i) or TOKENS[i - 1])
                                                            for i in ids],
                                        patterns_layer=2 if pattern else None, model="test")


def test_the_json_is_the_command_lines_contract():
    r = result()
    out = json.loads(r.dumps())
    assert out["target"] == "Paris" and out["foil"] == "Rome" and out["position"] == 4
    assert out["target_token"] == " Paris" and out["foil_token"] == " Rome"
    parts = out["parts"]
    assert len(parts["attn"]) == len(parts["mlp"]) == len(parts["heads"]) == 3 and len(parts["heads"][0]) == 2
    assert out["sum"] == pytest.approx(parts["embed"] + sum(parts["attn"]) + sum(parts["mlp"]) + parts["bias"])
    assert out["gap"] == pytest.approx(out["logit"] - out["sum"]) and abs(out["gap"]) < 1e-5
    assert list(out["patterns"]) == ["2"] and np.asarray(out["patterns"]["2"]).shape == (2, 5)
    np.testing.assert_allclose(out["patterns"]["2"], r.pattern[:, -1], rtol=1e-6)
    orjson.dumps(out)                                  # string keys only: what Gradio sends
    assert "patterns" not in result(pattern=False).to_json()
    assert result(foil=False).to_json()["foil"] is None and result(foil=False).what == "logit(' Paris')"


def test_the_heads_sum_to_the_attention_and_the_frames_hold_every_part():
    r = result()
    np.testing.assert_allclose(r.heads.sum(1) + r.attn_bias, r.attn, rtol=1e-6)
    layers = r.layer_frame()
    assert layers["running"].iloc[-1] == pytest.approx(r.total, rel=1e-6)
    heads = r.heads_frame()
    assert len(heads) == 6 and heads["attends"].str.contains("' France'|'The'|' is'|' of'|' capital'").all()
    csv = r.to_csv().splitlines()
    assert csv[0] == "part,layer,head,value" and len(csv) == 1 + 1 + 3 * (3 + 2) + 3
    pattern = pattern_frame(r)
    assert len(pattern) == 2 * 15 and (pattern["key"] <= pattern["query"]).all()


def test_inconsistent_shapes_are_refused():
    out = output()
    with pytest.raises(ValueError, match="position"):
        ComponentsResult.from_output(out, prompt="x", ids=[1, 2], position=4, target=Target("a", (1,)), foil=None,
                                     decode=lambda ids: ["t"] * len(ids))
    out.pattern = out.pattern[:, :3, :3]
    with pytest.raises(ValueError, match="pattern"):
        ComponentsResult.from_output(out, prompt="x", ids=[1, 2, 3, 4, 5], position=4, target=Target("a", (1,)),
                                     foil=None, decode=lambda ids: ["t"] * len(ids), patterns_layer=0)

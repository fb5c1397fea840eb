import json

import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

from lensapp.results import GenerationResult, GenerationStep, LensReadout, LensResult, TargetScore, dumps
from lensapp.results.export import round_floats


def make_result(P=3, L=2, k=2, prompt="a b c"):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 100, size=(L, P, k))
    probs = np.sort(rng.random((L, P, k)), axis=-1)[..., ::-1].astype(np.float32)
    tokens = [[[f"<t{i}>" for i in pos] for pos in layer] for layer in ids]
    ro = LensReadout(top_ids=ids, top_probs=probs, top_tokens=tokens,
                     entropy=rng.random((L, P)).astype(np.float32), kl_to_final=rng.random((L, P)).astype(np.float32),
                     targets=[TargetScore("x", [1, 2], ["x", "y"], rng.random((L, P)), np.ones((L, P), int),
                                          np.log(rng.random(L)))])
    return LensResult(prompt=prompt, input_ids=list(range(P)), input_tokens=[f"w{i}" for i in range(P)],
                      layers=list(range(L)), lenses={"logit": ro}, model_next_id=1, model_next_token="y")


def test_json_schema_and_csv_rows():
    r = make_result()
    js = json.loads(dumps(r))
    assert set(js) >= {"input_tokens", "layers", "lenses", "model_next_token"}
    lens = js["lenses"]["logit"]
    assert np.array(lens["top_probs"]).shape == (2, 3, 2)
    assert np.array(lens["entropy"]).shape == (2, 3)
    assert lens["targets"][0]["scored_as"].startswith("first token")
    assert len(lens["targets"][0]["continuation_prob"]) == 2
    assert r.to_csv().count("\n") == 1 + 2 * 3 * 2          # header + layer x position x rank
    table = r.top_k_table("logit", position=-1)
    assert list(table["layer"]) == [0, 1] and "#2" in table


def test_inconsistent_shapes_are_refused():
    r = make_result()
    with pytest.raises(ValueError):
        LensResult(prompt="x", input_ids=[1], input_tokens=["x"], layers=[0, 1], lenses=r.lenses,
                   model_next_id=0, model_next_token="")


def test_generation_grid_has_one_column_per_step():
    steps = [GenerationStep(token_id=1, token=t, readout=make_result(P=3 if s == 0 else 1))
             for s, t in enumerate("abc")]
    g = GenerationResult(prompt="p", text="abc", token_ids=[1, 1, 1], tokens=list("abc"), steps=steps)
    assert g.step_grid().shape == (2, 3)
    assert len(json.loads(dumps(g))["steps"]) == 3


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(st.sampled_from([np.float32, np.float64]), hnp.array_shapes(min_dims=0, max_dims=3, min_side=0,
                                                                               max_side=4)))
def test_round_floats_keeps_five_significant_digits_and_the_nesting(a):
    """The JSON's numbers: each value as '%.5g' reads back, in the array's own nesting (byte-stable output)."""
    def reference(x):
        return [reference(v) for v in x] if isinstance(x, np.ndarray) and x.ndim else float(f"{float(x):.5g}")
    got, want = round_floats(a), reference(np.asarray(a, dtype=np.float64))
    assert json.dumps(got) == json.dumps(want)

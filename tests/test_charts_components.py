"""The components charts and the sublayer heatmap from hand-built results: marks, encodings, data rows."""

import numpy as np
import pytest
from test_charts import HOSTILE, lens_result, readout
from test_components_results import result

from lensapp import charts
from lensapp.charts import components as cc


def test_layer_bars_put_attention_and_mlp_side_by_side_with_a_running_total():
    r = result()
    d = cc.layer_bars(r).to_dict()
    zero, bars, line = d["layer"]
    assert bars["mark"]["type"] == "bar" and bars["encoding"]["xOffset"]["field"] == "part"
    rows = bars["data"]["values"]
    assert len(rows) == 2 * r.n_layers and {row["part"] for row in rows} == {"attention", "MLP"}
    assert [row["value"] for row in rows if row["part"] == "MLP"] == pytest.approx(r.mlp.tolist())
    running = [row["running"] for row in line["data"]["values"]]
    assert running[-1] == pytest.approx(r.total, rel=1e-6)
    assert "Paris" in d["title"] and "Rome" in d["title"]


def test_the_head_heatmap_has_a_cell_per_head_and_says_where_it_looks():
    r = result()
    d = cc.head_heatmap(r).to_dict()
    rows = d["data"]["values"]
    assert len(rows) == r.heads.size
    assert rows[0]["value"] == pytest.approx(float(r.heads[0, 0]))
    tips = [t["field"] for t in d["layer"][0]["encoding"]["tooltip"]]
    assert "attends" in tips and "value" in tips
    scale = d["layer"][0]["encoding"]["color"]["scale"]
    assert scale["domain"][0] == -scale["domain"][1]                  # diverging around zero


def test_the_pattern_charts_draw_the_row_and_the_small_multiples():
    r = result()
    row = cc.pattern_row(r).to_dict()
    assert len(row["data"]["values"]) == 2 * (r.position + 1)
    grid = cc.pattern_grid(r).to_dict()
    assert grid["facet"]["field"] == "head" and len(grid["data"]["values"]) == 2 * 15
    windowed = cc.pattern_grid(r, window=3).to_dict()
    assert {v["query"] for v in windowed["data"]["values"]} == {2, 3, 4} and "positions 2-4" in windowed["title"]
    with pytest.raises(ValueError, match="patterns"):
        cc.pattern_row(result(pattern=False))


def test_the_sublayer_heatmap_interleaves_attn_and_mlp_rows():
    r = lens_result(L=3, P=4, input_tokens=["a", HOSTILE, "c", "d"])
    r.after_attention = {"logit": readout(3, 4, seed=7)}
    d = charts.sublayer_heatmap(r).to_dict()
    rows = d["layer"][0]["data"]["values"] if "data" in d["layer"][0] else d["data"]["values"]
    assert len(rows) == 2 * 3 * 4
    order = d["layer"][0]["encoding"]["y"]["sort"]
    assert order == ["2.mlp", "2.attn", "1.mlp", "1.attn", "0.mlp", "0.attn"]
    attn = [row for row in rows if row["row"] == "1.attn" and row["position"] == 0][0]
    assert attn["value"] == pytest.approx(float(r.after_attention["logit"].top_probs[1, 0, 0]))
    assert any(HOSTILE.replace(" ", "␣")[:10] in row["token"] for row in rows)       # tokens stay data
    with pytest.raises(ValueError, match="sublayers"):
        charts.sublayer_heatmap(lens_result())
    assert np.isfinite([row["value"] for row in rows]).all()

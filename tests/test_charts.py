"""Charts from hand-built results: marks, encodings, data rows, visible whitespace, tokens as data."""

import json

import numpy as np
import pytest

from lensapp import charts
from lensapp.results import GenerationResult, GenerationStep, LensReadout, LensResult, TargetScore

HOSTILE = "<img src=x onerror=alert(1)>"


def readout(L, P, k=3, seed=0, tokens=None, targets=()):
    rng = np.random.default_rng(seed)
    probs = np.sort(rng.dirichlet(np.ones(k + 2), size=(L, P))[..., :k], axis=-1)[..., ::-1].astype(np.float32)
    toks = tokens or [[[f"t{layer}{pos}{j}" for j in range(k)] for pos in range(P)] for layer in range(L)]
    return LensReadout(
        top_ids=rng.integers(0, 100, size=(L, P, k)), top_probs=np.ascontiguousarray(probs), top_tokens=toks,
        entropy=rng.uniform(0, 5, size=(L, P)).astype(np.float32),
        kl_to_final=rng.uniform(0, 3, size=(L, P)).astype(np.float32), targets=list(targets))


def lens_result(L=4, P=5, k=3, lenses=("logit",), input_tokens=None, tokens=None, with_target=False):
    input_tokens = input_tokens or ["The", " capital", " of", " France", " is"][:P]
    targets = ()
    if with_target:
        rng = np.random.default_rng(1)
        targets = (TargetScore("Paris", [1], [" Paris"], rng.uniform(0, 1, (L, P)).astype(np.float32),
                               rng.integers(1, 5000, (L, P))),)
    return LensResult(prompt="".join(input_tokens), input_ids=list(range(P)), input_tokens=input_tokens,
                      layers=list(range(L)),
                      lenses={n: readout(L, P, k, seed=i, tokens=tokens, targets=targets)
                              for i, n in enumerate(lenses)},
                      model_next_id=0, model_next_token=" Paris", model="test")


def spec(chart):
    return chart.to_dict()


def layer_rows(d):
    """The data rows of the first (or only) layered heatmap in a spec."""
    node = d if "layer" in d else d["hconcat"][0]
    return node["data"]["values"]


def test_heatmap_has_one_cell_per_layer_and_position():
    d = spec(charts.lens_heatmap(lens_result(L=4, P=5)))
    marks = [layer["mark"]["type"] for layer in d["layer"]]
    assert marks == ["rect", "text"]
    rows = layer_rows(d)
    assert len(rows) == 4 * 5
    assert {r["layer"] for r in rows} == {0, 1, 2, 3}
    assert len({r["column"] for r in rows}) == 5
    rect = d["layer"][0]["encoding"]
    assert rect["y"]["field"] == "layer" and rect["y"]["sort"] == "descending"        # layer 0 at the bottom
    assert rect["color"]["scale"]["scheme"] == "viridis"
    assert rect["color"]["title"] == "top-1 probability"                           # the legend names the metric
    assert rect["x"]["sort"] == ["The", "␣capital", "␣of", "␣France", "␣is"]   # in order, whitespace visible
    assert d["layer"][1]["encoding"]["text"]["field"] == "top1"
    tips = [t["title"] for t in rect["tooltip"]]
    assert tips[-3:] == ["#1", "#2", "#3"]                                         # the top-k in the tooltip


def test_heatmap_cells_carry_top1_and_top_k():
    result = lens_result(L=2, P=2, input_tokens=["a", "b"])
    rows = layer_rows(spec(charts.lens_heatmap(result)))
    cell = next(r for r in rows if r["layer"] == 1 and r["position"] == 0)
    assert cell["top1"] == "t100"
    assert cell["t1"].startswith("t100") and cell["t1"].endswith("%")
    assert cell["value"] == pytest.approx(float(result.lenses["logit"].top_probs[1, 0, 0]))


def test_whitespace_glyphs_and_repeated_tokens():
    assert charts.show_token(" a\nb\tc") == "␣a↵b⇥c"
    assert charts.show_token("") == "∅"
    assert charts.show_token("\x00") == "␀"
    assert charts.show_token("\xa0") == "⍽"
    assert charts.show_token("a\u202eb\u200b") == "a⟨U+202E⟩b⟨U+200B⟩"     # bidi / zero-width: visible, inert
    assert charts.show_token("巴黎 é") == "巴黎␣é"
    labels = charts.column_labels([" the", " the", "\n"], 14)
    assert labels[0] == "␣the" and labels[1] == "␣the\u200b" and labels[2] == "↵"
    assert len(set(labels)) == 3


def test_hostile_token_text_is_plain_data():
    toks = [[[HOSTILE, "b", "c"] for _ in range(2)] for _ in range(2)]
    result = lens_result(L=2, P=2, input_tokens=[HOSTILE, " x"], tokens=toks)
    d = spec(charts.lens_heatmap(result, settings=charts.DisplaySettings(max_cell_chars=40, max_label_chars=40)))
    rows = layer_rows(d)
    assert rows[0]["top1"] == "<img␣src=x␣onerror=alert(1)>"       # kept verbatim (spaces shown), never parsed
    assert rows[0]["token"] == "<img␣src=x␣onerror=alert(1)>"
    text = json.dumps(d)
    assert "format" not in d["layer"][1]["encoding"]["text"]         # no html/markdown formatter on the text mark
    assert "labelExpr" not in text                                   # labels are not code either


def test_metrics_and_target_legend():
    result = lens_result(with_target=True)
    d = spec(charts.lens_heatmap(result, metric="target_rank"))
    color = d["layer"][0]["encoding"]["color"]
    assert color["title"] == "rank of ␣Paris"
    assert color["scale"]["type"] == "log" and color["scale"]["reverse"] is True
    color = spec(charts.lens_heatmap(result, metric="entropy"))["layer"][0]["encoding"]["color"]
    assert color["title"] == "entropy (nats)"
    with pytest.raises(ValueError, match="needs a target"):
        charts.lens_heatmap(lens_result(), metric="target_prob")
    with pytest.raises(ValueError, match="unknown metric"):
        charts.lens_heatmap(lens_result(), metric="nope")


def test_export_menu_and_size():
    d = spec(charts.lens_heatmap(lens_result(L=30, P=40, input_tokens=[f" w{i}" for i in range(40)])))
    opts = d["usermeta"]["embedOptions"]
    assert opts["actions"]["export"] is True and opts["actions"]["editor"] is False
    assert d["width"] == {"step": 58} and d["height"] == {"step": 20}
    assert len(layer_rows(d)) == 30 * 40


def test_a_long_prompt_is_drawn_as_a_window_under_an_overview():
    P, W = 300, charts.DisplaySettings().max_columns
    result = lens_result(L=30, P=P, input_tokens=[f" w{i}" for i in range(P)])
    d = spec(charts.lens_heatmap(result))
    overview, window = d["vconcat"]
    rows = window["data"]["values"]
    assert len(rows) == 30 * W and {r["position"] for r in rows} == set(range(P - W, P))     # the last positions
    assert f"positions {P - W}–{P - 1} of {P}" in window["title"]
    bands = overview["data"]["values"]
    assert {r["position"] for r in bands} == set(range(P)) and len(bands) == 6 * P           # every position, no text
    assert sum(r["shown"] for r in bands) == 6 * W
    moved = spec(charts.lens_heatmap(result, start=10))["vconcat"][1]
    assert {r["position"] for r in moved["data"]["values"]} == set(range(10, 10 + W))
    colour = window["layer"][0]["encoding"]["color"]["scale"]["domain"]
    assert moved["layer"][0]["encoding"]["color"]["scale"]["domain"] == colour   # one scale as the window moves
    pair = spec(charts.lens_pair(lens_result(L=4, P=P, lenses=("logit", "jacobian"),
                                             input_tokens=[f" w{i}" for i in range(P)]), start=0))
    assert {r["position"] for r in pair["hconcat"][0]["data"]["values"]} == set(range(W))
    table = charts.lens_table(result)                          # the table alternative: the same window
    assert list(table.columns) == [f"{i}: ␣w{i}" for i in range(P - W, P)] and len(table) == 30
    assert list(charts.lens_table(result, start=10).columns)[0] == "10: ␣w10"


def test_compare_aligns_prompts_at_the_end_and_draws_no_padding():
    from lensapp.results import Comparison

    short, long = lens_result(P=3, input_tokens=["The", " capital", " is"]), lens_result(P=5)
    comparison = Comparison([short, long])
    assert comparison.width == 5 and comparison.padding(0) == 2 and comparison.padding(1) == 0
    d = spec(charts.compare_heatmaps(comparison))
    first, second = d["hconcat"]                                                   # side by side
    assert len(first["data"]["values"]) == 4 * 3 and len(second["data"]["values"]) == 4 * 5   # cells: tokens only
    order = first["layer"][0]["encoding"]["x"]["sort"]
    assert len(order) == 5 and order[-3:] == ["The", "␣capital", "␣is"]           # two empty columns first
    assert all(ch == "\u2063" for ch in "".join(order[:2]))                         # labels that show nothing
    assert d["resolve"]["scale"]["color"] == "shared"                               # one colour legend
    table = comparison.last_position_table("logit")
    assert list(table.columns[:3]) == ["layer", "prompt 1", "p1"] and len(table) == 4


def test_pair_and_diff():
    result = lens_result(lenses=("logit", "jacobian"))
    d = spec(charts.lens_pair(result))
    assert [c["title"] for c in d["hconcat"]] == ["Jacobian lens", "logit lens"]
    assert d["resolve"]["scale"]["color"] == "shared"
    d = spec(charts.lens_diff(result))
    rows = d["data"]["values"] if "data" in d else layer_rows(d)
    assert len(rows) == 4 * 5
    assert all(r["differ"] == "differs" for r in rows if r["top1"])
    assert [layer["mark"]["type"] for layer in d["layer"]] == ["rect", "rect", "text"]
    assert d["layer"][0]["mark"]["color"] == "#c4c4c4"                       # every cell grey ...
    assert d["layer"][1]["encoding"]["color"]["scale"]["scheme"] == "blueorange"   # ... differing ones coloured
    assert d["layer"][1]["transform"] == [{"filter": "datum.delta !== null"}]


def test_diff_marks_agreeing_cells_grey():
    result = lens_result(lenses=("logit", "jacobian"))
    result.lenses["jacobian"].top_tokens = result.lenses["logit"].top_tokens     # identical J: nothing differs
    rows = spec(charts.lens_diff(result))["data"]["values"]
    assert all(r["differ"] == "same top-1" and r["top1"] == "" and r["delta"] is None for r in rows)


def test_target_curves():
    d = spec(charts.target_curves(lens_result(with_target=True), lenses=("logit",)))
    rows = d["hconcat"][0]["data"]["values"]
    assert [r["layer"] for r in rows] == [0, 1, 2, 3]
    assert rows[0]["target"] == "Paris"
    assert d["hconcat"][1]["layer"][0]["encoding"]["y"]["scale"]["reverse"] is True
    with pytest.raises(ValueError, match="no targets"):
        charts.target_curves(lens_result())


def test_target_curves_score_multi_token_targets_whole_at_the_last_position():
    result = lens_result(with_target=True)
    t = result.lenses["logit"].targets[0]
    t.token_ids, t.tokens = [1, 2], [" Par", "is"]
    t.continuation_logprob = np.log(np.array([0.1, 0.2, 0.3, 0.4]))
    rows = spec(charts.target_curves(result))["hconcat"][0]["data"]["values"]
    assert [r["prob"] for r in rows] == pytest.approx([0.1, 0.2, 0.3, 0.4])
    assert rows[0]["target"] == "Paris (whole word)"
    rows = spec(charts.target_curves(result, position=1))["hconcat"][0]["data"]["values"]
    assert rows[0]["target"] == "Paris" and rows[0]["prob"] == pytest.approx(float(t.probs[0, 1]))


def test_generation_heatmap_one_column_per_step():
    steps = []
    prompt = lens_result(L=3, P=4, input_tokens=["a", "b", "c", "d"])
    steps.append(GenerationStep(token_id=1, token=" Paris", readout=prompt))
    for s, tok in enumerate([".", " Paris", "\n"]):
        r = lens_result(L=3, P=1, input_tokens=[tok])
        steps.append(GenerationStep(token_id=s, token=tok, readout=r))
    gen = GenerationResult(prompt="abcd", text=" Paris. Paris\n", token_ids=[1, 2, 3, 4],
                           tokens=[" Paris", ".", " Paris", "\n"], steps=steps)
    d = spec(charts.generation_heatmap(gen))
    rows = layer_rows(d)
    assert len(rows) == 3 * 4
    assert d["layer"][0]["encoding"]["x"]["sort"] == ["␣Paris", ".", "␣Paris\u200b", "↵"]
    assert d["layer"][0]["encoding"]["x"]["title"].startswith("generated token")
    # step 0 reads the prompt's last position
    cell = next(r for r in rows if r["step"] == 0 and r["layer"] == 2)
    assert cell["top1"] == prompt.lenses["logit"].top_tokens[2][3][0]


def test_display_tokens():
    import pandas as pd

    df = charts.display_tokens(pd.DataFrame({"lens": ["logit lens"], "layer": [0], "#1": [" a\n"], "p1": [0.5]}))
    assert df.loc[0, "#1"] == "␣a↵" and df.loc[0, "p1"] == 0.5 and df.loc[0, "lens"] == "logit lens"


def test_charts_do_not_import_torch():
    import subprocess
    import sys

    code = "import sys, lensapp.charts; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_the_page_gets_the_same_spec_built_without_validation():
    """The UI builds and serialises charts with Altair's validation off (`ui.tabs.build_chart`, for
    speed); what reaches the page must be the spec the validated path gives."""
    import json

    from lensapp.ui.tabs import build_chart

    result = lens_result(L=6, P=5, lenses=("logit", "jacobian"), with_target=True)
    for make, args in [(charts.lens_heatmap, (result,)), (charts.lens_pair, (result,)), (charts.lens_diff, (result,)),
                       (charts.target_curves, (result,))]:
        fast = build_chart(make, *args)
        assert fast.type == "altair"
        assert json.loads(fast.plot) == spec(make(*args))

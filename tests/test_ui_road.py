"""issue 28's page handlers on the tiny service, as the page calls them: a generation with a link's branches, a
branch grown from a clicked token (and a branch of it), the strip's rule, a cell described; bad values say so in
one line. The real page (Chromium) is test_ui_browser_road.py."""

from __future__ import annotations

import gradio as gr
import pytest
from hostile import assert_page_error

from lensapp import config
from lensapp.service import GenerateRequest
from lensapp.ui import branching, permalinks
from lensapp.ui.decisions import draw_strip, strip_summary

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def app(tiny_service):
    from lensapp import ui

    return ui.build_ui(tiny_service, config.Config(jlens="none", rate_limit=0))


def generate(app, branches: str = ""):
    """The Generate tab's run, as a link restores it: its outputs by name."""
    parts = app.tabs["generate"]
    out = parts.run(PROMPT, 6, 0.0, "logit", "all", 5, False, None, False, branches, "top1")
    names = ["state", "seed", "text", "heatmap", "step", "table_lens", "table", "csv", "json", "req", "strip",
             "summary", *branching.UPDATED]
    return dict(zip(names, out))


def test_a_links_branches_are_grown_with_the_generation(app, tiny_service):
    out = generate(app, "2=#11;2=#11,4=#12")
    gen, results = out["state"], out["results"]
    assert [r.forced for r in results] == [[(2, 11)], [(2, 11), (4, 12)]]
    assert out["branches"] == "2=#11;2=#11,4=#12" and results[1].token_ids[:3] == results[0].token_ids[:3]
    assert "parts at step 2" in out["listing"] and out["heatmap"] is not None and out["divergence"] is not None
    direct = tiny_service.generate(GenerateRequest(prompt=PROMPT, max_tokens=6, force=["2=#11", "4=#12"]))
    assert results[1].token_ids == direct.token_ids and gen.token_ids == generate(app)["state"].token_ids
    assert "settle" in out["summary"] and out["strip"] is not None
    # a link's branch that no longer fits is left out (with a warning), the rest kept
    assert [r.forced for r in generate(app, "2=#11;50=#3")["results"]] == [[(2, 11)]]


def test_a_clicked_token_shows_its_alternatives_and_grows_a_branch(app):
    out = generate(app)
    gen, req = out["state"], out["req"]
    alts = branching.alternatives_at(gen, [], branching.TRUNK, 1, 2)
    choices = alts.constructor_args["choices"]
    assert any("the one taken" in label for label, _ in choices) and all(v.startswith("#") for _, v in choices)
    assert any("output" in label for label, _ in choices) and any("layer 2" in label for label, _ in choices)
    grow = app.tabs["generate"].handlers["grow_branch"]
    first = dict(zip(branching.UPDATED, grow(gen, req, [], branching.TRUNK, 1, "#21", "top1")))
    assert first["branches"] == "1=#21" and first["results"][0].token_ids[1] == 21
    # branch the branch at a later step: its chain keeps the first force
    again = dict(zip(branching.UPDATED, grow(gen, req, first["results"], 0, 3, "#22", "top1")))
    assert again["branches"] == "1=#21;1=#21,3=#22"
    # the same branch twice is shown, not added
    same = dict(zip(branching.UPDATED, grow(gen, req, again["results"], branching.TRUNK, 1, "#21", "top1")))
    assert same["branches"] == "1=#21;1=#21,3=#22"
    for bad in ("Parisiennes", "", "#99999999"):
        with pytest.raises(gr.Error) as e:
            grow(gen, req, [], branching.TRUNK, 1, bad, "top1")
        assert_page_error(e.value)
    with pytest.raises(gr.Error, match="Click a generated token"):
        grow(gen, req, [], branching.TRUNK, None, "#5", "top1")


def test_the_strip_switches_rule_without_a_request(app, tiny_service):
    gen = generate(app)["state"]
    calls = tiny_service.engine.health()["calls"]["served"]
    for rule in ("top1", "top5", "p50"):
        plot, text = draw_strip(gen, rule)
        assert plot is not None and text == strip_summary(gen, rule)
    assert tiny_service.engine.health()["calls"]["served"] == calls


def test_a_cell_is_described_from_the_lens_tab(app):
    parts = app.tabs["logit"]
    out = parts.run(PROMPT, "all", 5, "", "top1_prob", False, False, None, False, "")
    result = out[0]
    table = parts.handlers["describe_at"](result, 2, False, "1", 3, "", None)
    assert list(table["layer"]) == [1] and table["token"][0] == "␣of"
    column = parts.handlers["describe_column"](result, 2, False, "1", 3, "", 2)
    assert list(column["layer"]) == [0, 1, 2, 3] and set(column["into layer"]) == {2}
    for bad in ("x", "99"):
        with pytest.raises(gr.Error) as e:
            parts.handlers["describe_at"](result, 2, False, bad, 3, "", None)
        assert_page_error(e.value)


def test_a_link_keeps_branches_as_ids():
    view, notices = permalinks.decode("tab=generate&prompt=Hi&branches=3%3D%237042%3B3%3D%237042%2C9%3D%2313")
    assert view.branches == "3=#7042;3=#7042,9=#13" and not notices
    assert permalinks.encode(view)["branches"] == "3=#7042;3=#7042,9=#13"
    assert "branches" not in permalinks.encode(permalinks.View(tab="generate"))
    view, notices = permalinks.decode("tab=generate&branches=3%3DParis")
    assert view.branches == "" and "token ids" in notices[0]

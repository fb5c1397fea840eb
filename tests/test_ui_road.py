"""issue 28's page handlers on the tiny service, as the page calls them: a generation with a link's branches, a
branch grown from a clicked token (and a branch of it), the strip's rule, a cell described; bad values say so in
one line. The real page (Chromium) is test_ui_browser_road.py."""

from __future__ import annotations

from functools import partial

import gradio as gr
import pytest
from hostile import assert_page_error

from lensapp import config
from lensapp.service import GenerateRequest
from lensapp.ui import branching, describing, generate_tab, permalinks
from lensapp.ui.decisions import draw_strip, redraw_strip, strip_summary
from lensapp.ui.kept import value_of
from lensapp.ui.views import TAB_VIEWS, View

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def app(tiny_service):
    from lensapp import ui

    return ui.build_ui(tiny_service, config.WebSettings(), config.LimitSettings(rate_limit=0))


def generate(app, branches: str = ""):
    """The Generate tab's run, as a link restores it: its outputs by name."""
    view = TAB_VIEWS["generate"]
    values = view.values_of(View(tab="generate", prompt=PROMPT, max_tokens=6, layers="all", branches=branches))
    return app.tabs["generate"].run({**values, "rule": "top1"})


def grow(app, tiny_service, out: dict, results: list, source, step, token) -> dict:
    """The panel's alternative picked, as the page sends it."""
    values = {"state": value_of(out["state"]), "req": value_of(out["req"]), "branch_results": results,
              "branch_source": source, "branch_step": step, "branch_alternatives": token, "rule": "top1"}
    return branching.grow(tiny_service, app.guard, "branch_alternatives", values)


def drawn(update) -> bool:
    """A branch chart's update shows a chart."""
    return update.constructor_args["visible"] and update.constructor_args["value"] is not None


def test_a_links_branches_are_grown_with_the_generation(app, tiny_service):
    out = generate(app, "2=#11;2=#11,4=#12")
    gen, results = value_of(out["state"]), value_of(out["branch_results"])
    assert [r.forced for r in results] == [[(2, 11)], [(2, 11), (4, 12)]]
    assert out["branches"] == "2=#11;2=#11,4=#12" and results[1].token_ids[:3] == results[0].token_ids[:3]
    assert "parts at step 2" in out["branch_listing"] and drawn(out["branch_heatmap"])
    assert drawn(out["branch_divergence"]) and out["branch_shown"].constructor_args["visible"]
    direct = tiny_service.generate(GenerateRequest(prompt=PROMPT, max_tokens=6, force=["2=#11", "4=#12"]))
    assert results[1].token_ids == direct.token_ids and gen.token_ids == value_of(generate(app)["state"]).token_ids
    assert "settle" in out["decided"] and out["strip"] is not None
    # a link's branch that no longer fits is left out (with a warning), the rest kept
    assert [r.forced for r in value_of(generate(app, "2=#11;50=#3")["branch_results"])] == [[(2, 11)]]
    # the page's own Generate starts afresh: no branches
    fresh = generate_tab.run_fresh(TAB_VIEWS["generate"], tiny_service, app.guard,
                                   {**TAB_VIEWS["generate"].values_of(View(tab="generate", prompt=PROMPT, max_tokens=6,
                                                                           branches="2=#11")), "rule": "top1"})
    assert value_of(fresh["branch_results"]) == [] and fresh["branches"] == ""
    # no branch: its charts and its choice are hidden, not empty frames
    assert not any(fresh[name].constructor_args["visible"] for name in (*branching.SHOWN, "branch_shown"))


def test_a_clicked_token_shows_its_alternatives_and_grows_a_branch(app, tiny_service):
    out = generate(app)
    gen = value_of(out["state"])
    alts = branching.alternatives_at(gen, [], branching.TRUNK, 1, 2)
    choices = alts.constructor_args["choices"]
    assert any("the one taken" in label for label, _ in choices) and all(v.startswith("#") for _, v in choices)
    assert any("output" in label for label, _ in choices) and any("layer 2" in label for label, _ in choices)
    picked = branching.pick_step(app.guard, {"state": gen, "branch_results": [], "branch_source": branching.TRUNK,
                                             "branch_step": 1, "branch_layer": 2})
    assert picked["branch_alternatives"].constructor_args["choices"] == choices
    assert picked["branch_alternatives"].constructor_args["visible"]
    first = grow(app, tiny_service, out, [], branching.TRUNK, 1, "#21")
    assert set(first) == set(branching.UPDATED)
    assert first["branches"] == "1=#21" and value_of(first["branch_results"])[0].token_ids[1] == 21
    # branch the branch at a later step: its chain keeps the first force
    again = grow(app, tiny_service, out, value_of(first["branch_results"]), 0, 3, "#22")
    assert again["branches"] == "1=#21;1=#21,3=#22"
    # the same branch twice is shown, not added
    same = grow(app, tiny_service, out, value_of(again["branch_results"]), branching.TRUNK, 1, "#21")
    assert same["branches"] == "1=#21;1=#21,3=#22"
    shown = branching.show(app.guard, {"state": gen, "branch_results": value_of(again["branch_results"]),
                                       "branch_shown": 0, "rule": "top5"})
    assert set(shown) == set(branching.SHOWN) and drawn(shown["branch_heatmap"]) and drawn(shown["branch_strip"])
    # a word is read as the model would write it after the text there: its first token is taken (and named)
    word = grow(app, tiny_service, out, [], branching.TRUNK, 1, "Parisiennes")
    before = tiny_service.prompts.ids(PROMPT) + gen.token_ids[:1]
    wanted = tiny_service.prompts.word("Parisiennes", before).token_ids[0]
    assert value_of(word["branch_results"])[0].token_ids[1] == wanted
    for bad in ("", "#99999999"):
        with pytest.raises(gr.Error) as e:
            grow(app, tiny_service, out, [], branching.TRUNK, 1, bad)
        assert_page_error(e.value)
    with pytest.raises(gr.Error, match="Click a generated token"):
        grow(app, tiny_service, out, [], branching.TRUNK, None, "#5")


def test_the_strip_switches_rule_without_a_request(app, tiny_service):
    gen = value_of(generate(app)["state"])
    calls = tiny_service.engine.health()["calls"]["served"]
    for rule in ("top1", "top5", "p50"):
        plot, text = draw_strip(gen, rule)
        assert plot is not None and text == strip_summary(gen, rule)
        assert redraw_strip(app.guard, {"state": gen, "rule": rule})["decided"] == text
    assert tiny_service.engine.health()["calls"]["served"] == calls


def test_a_cell_is_described_from_the_lens_tab(app, tiny_service):
    view = TAB_VIEWS["logit"]
    result = value_of(app.tabs["logit"].run(view.values_of(View(tab="logit", prompt=PROMPT, layers="all")))["state"])

    def cell(every_layer: bool, layer, inspect_layer=None):
        values = {"state": result, "position": 2, "chat": False, "describe_layer": layer, "describe_max_tokens": 3,
                  "describe_inspect": "", "describe_inspect_layer": inspect_layer}
        return partial(describing.describe, tiny_service, app.guard, every_layer)(values)["describe_table"]

    table = cell(False, "1")
    assert list(table["layer"]) == [1] and table["token"][0] == "␣of"
    column = cell(True, "1", 2)
    assert list(column["layer"]) == [0, 1, 2, 3] and set(column["into layer"]) == {2}
    for bad in ("x", "99"):
        with pytest.raises(gr.Error) as e:
            cell(False, bad)
        assert_page_error(e.value)


def test_a_link_keeps_branches_as_ids():
    view, notices = permalinks.decode("tab=generate&prompt=Hi&branches=3%3D%237042%3B3%3D%237042%2C9%3D%2313")
    assert view.branches == "3=#7042;3=#7042,9=#13" and not notices
    assert permalinks.encode(view)["branches"] == "3=#7042;3=#7042,9=#13"
    assert "branches" not in permalinks.encode(permalinks.View(tab="generate"))
    view, notices = permalinks.decode("tab=generate&branches=3%3DParis")
    assert view.branches == "" and "token ids" in notices[0]


def test_the_chats_last_reply_branches(app, tiny_service):
    from lensapp.ui import chat_tab

    values = {**chat_tab.CHAT.initial(), "lens": "logit", "layer": None, "max_tokens": 4, "message": "Hi there",
              "chatbot": []}
    assert "force" not in values                                   # the branch box forces, not the form
    out = chat_tab.send(chat_tab.CHAT, tiny_service, app.guard, values)
    assert set(branching.CHAT_UPDATED) <= set(out)
    assert value_of(out["chat_last"])[1].text == chat_tab.conversation(out["chatbot"])[-1]["content"]
    last = value_of(out["chat_last"])
    picked = branching.chat_alternatives({"chat_last": last, "chat_branch_step": 1})
    choices = picked["chat_branch_alternatives"].constructor_args["choices"]
    assert choices and all(v.startswith("#") for _, v in choices)
    token = choices[-1][1]
    grown = branching.grow_chat(tiny_service, app.guard, chat_tab.readout_html, "chat_branch_alternatives",
                                {"chat_last": last, "chat_branch_step": 1, "chat_branch_alternatives": token,
                                 "chatbot": out["chatbot"]})
    assert len(grown["chatbot"]) == len(out["chatbot"]) + 2 and "branch at token 1" in grown["chatbot"][-2]["metadata"][
        "title"]
    with pytest.raises(gr.Error, match="Send a message first"):
        branching.grow_chat(tiny_service, app.guard, chat_tab.readout_html, "chat_branch_word",
                            {"chat_last": None, "chat_branch_step": 1, "chat_branch_word": "#5", "chatbot": []})
    assert chat_tab.forget({})["chat_last"] is None

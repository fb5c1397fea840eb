"""The Components tab without a page: its handler by name, its link, the lens cells that open it ("who wrote
this?"), and hostile input through the guard (one line). The page itself: test_components_browser.py."""

from __future__ import annotations

import json

import gradio as gr
import hostile
import pytest
from gradio.components.plot import PlotData
from hostile import anything, numbers, scaled, texts, words
from hypothesis import given
from hypothesis import strategies as st

from lensapp import config
from lensapp.results import ComponentsResult
from lensapp.ui import permalinks as pl
from lensapp.ui.components_tab import cell_link, read_components
from lensapp.ui.kept import value_of
from lensapp.ui.views import TAB_VIEWS

HOSTILE = "<img src=x onerror=alert(1)>"
INPUTS = ("prompt", "target", "foil", "position", "patterns", "chat")      # the components request's fields
OUTPUTS = ("summary", "by_layer", "by_head", "pattern_row", "pattern_grid", "state", "csv", "json")
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def built(tiny_service):
    from lensapp import ui

    return ui.build_ui(tiny_service, config.WebSettings(), config.LimitSettings(rate_limit=0))


def test_the_handler_answers_every_output_by_name(tiny_service):
    values = {"prompt": PROMPT, "target": "Paris", "foil": "Rome", "position": -1, "patterns": 1, "chat": False}
    out = read_components(tiny_service, values)
    assert set(out) == set(OUTPUTS)
    assert isinstance(value_of(out["state"]), ComponentsResult) and value_of(out["state"]).patterns_layer == 1
    for name in ("by_layer", "by_head"):
        assert isinstance(out[name], PlotData)
    assert out["pattern_row"].visible and out["pattern_grid"].visible
    assert "the parts sum to" in out["summary"] and "strongest head" in out["summary"]
    quiet = read_components(tiny_service, values | {"patterns": float("nan"), "foil": ""})    # an emptied box
    assert not quiet["pattern_row"].visible and "Choose a layer" in quiet["summary"]


def test_the_tab_runs_through_the_guard_and_hostile_input_is_one_line(built):
    tab = built.tabs["components"]
    assert tuple(tab.inputs) == INPUTS and set(OUTPUTS) <= set(tab.outputs)
    out = tab.run(dict(zip(INPUTS, (HOSTILE, HOSTILE, "", -1, None, False))))       # text is data: it runs
    assert value_of(out["state"]).prompt == HOSTILE
    assert "<" not in out["summary"] and "&lt;" in out["summary"]                                     # escaped
    for values, said in (((PROMPT, "", "", -1, None, False), "target is empty"),
                          ((PROMPT, "Paris", "", 99, None, False), "outside the prompt"),
                          ((PROMPT, "Paris", "", -1, 9, False), "outside the layers"),
                          (("", "Paris", "", -1, None, False), "prompt")):
        with pytest.raises(gr.Error) as e:
            tab.run(dict(zip(INPUTS, values)))
        assert said in e.value.message and "\n" not in e.value.message


def test_a_components_link_round_trips():
    view = pl.View(tab="components", prompt=f"{PROMPT}\n{HOSTILE}", target="Paris", foil="Rome", position=3,
                   patterns=-2, chat=True)
    back, notices = pl.decode(pl.query_string(view))
    assert notices == [] and back.tab == "components"
    assert TAB_VIEWS["components"].values_of(back) == dict(zip(INPUTS, [f"{PROMPT}\n{HOSTILE}", "Paris", "Rome", 3,
                                                                         -2, True]))
    plain = pl.encode(pl.View(tab="components"))
    assert "patterns" not in plain and plain["target"] == "Paris"           # no pattern asked: none in the link
    bad, notices = pl.decode("v=1&tab=components&position=last&patterns=all&target=%00")
    assert (bad.position, bad.patterns, bad.target) == (-1, None, "Paris") and len(notices) == 3


def test_a_lens_cell_links_to_its_components(built):
    link = cell_link(PROMPT, chat=False)(12, 4, " Paris")
    view, notices = pl.decode(link)
    assert notices == [] and (view.tab, view.prompt, view.target, view.foil, view.position, view.patterns) == \
        ("components", PROMPT, "Paris", "", 4, 12)
    out = built.tabs["logit"].run(_lens_values(layers="all", k=3))
    spec = json.loads(out["heatmap"].plot)
    rows = next(node["data"]["values"] for node in _nodes(spec) if "data" in node and "values" in node["data"]
                and node["data"]["values"] and "href" in node["data"]["values"][0])
    cell = rows[-1]
    view, _ = pl.decode(cell["href"])
    assert view.tab == "components" and view.position == cell["position"] and view.patterns == cell["layer"]
    assert "href" in json.dumps(spec)


def test_the_logit_tab_draws_rows_inside_each_layer(built):
    values = _lens_values(layers="0-1", k=3, sublayers=True)
    out = built.tabs["logit"].run(values)
    spec = json.loads(out["heatmap"].plot)
    assert value_of(out["state"]).after_attention is not None
    assert '"0.attn"' in json.dumps(spec) and '"1.mlp"' in json.dumps(spec)
    view, _ = pl.decode(pl.query_string(TAB_VIEWS["logit"].view_of(values)))
    assert view.sublayers is True


def _lens_values(**given) -> dict:
    """The logit tab's input values by name: its example, with `given`."""
    return {**TAB_VIEWS["logit"].initial(), "prompt": PROMPT, "note": "", **given}


def _nodes(spec):
    """Every chart node of a (layered, concatenated, faceted) Vega-Lite spec."""
    yield spec
    for key in ("layer", "hconcat", "vconcat", "concat"):
        for child in spec.get(key, []):
            yield from _nodes(child)


COMPONENTS_TAB_FIELDS = (
    {"prompt": words(), "target": words(8), "foil": st.just("") | words(8), "position": st.integers(-6, 5),
     "patterns": st.none() | st.integers(-4, 3), "chat": st.booleans()},
    {"prompt": texts(), "target": texts(), "foil": anything(), "position": numbers(), "patterns": numbers(),
     "chat": anything()})


@scaled(30)
@given(kw=hostile.fields(*COMPONENTS_TAB_FIELDS))
def test_the_tab_answers_any_input_with_a_result_or_one_line(built, kw):
    out = hostile.page_outcome(built.tabs["components"].run, dict(kw))
    if isinstance(out, dict):
        assert isinstance(value_of(out["state"]), ComponentsResult)

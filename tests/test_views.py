"""The tabs' declarations (ui/views.py) and the inputs made from them (ui/form.py), without a model or a page:
a tab's link keys are its kind's fields in their published order with its extras in place, its inputs' values
make the request the API would make of the same values, a spread field takes numbered keys both ways, and a
field's widget, label and choices come from the field."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import gradio as gr
import pytest

from lensapp import config
from lensapp.service import fields as f
from lensapp.service.kinds import KINDS
from lensapp.ui import form, views
from lensapp.ui.views import TAB_VIEWS, View

FROZEN = json.loads((Path(__file__).parent / "data" / "published_surfaces.json").read_text())["links"]


def test_the_tabs_are_the_configured_tabs_and_each_names_a_kind():
    assert tuple(TAB_VIEWS) == config.TABS
    assert all(view.kind in KINDS for view in TAB_VIEWS.values())


@pytest.mark.parametrize("tab", ["logit", "jacobian", "compare", "intervene"])
def test_a_tabs_link_keys_keep_their_published_order(tab):
    assert list(views.tab_fields(tab)) == FROZEN[tab]


def test_a_tab_carries_its_kinds_fields_but_the_ones_it_omits_and_its_extras_after_theirs():
    logit = TAB_VIEWS["logit"]
    assert "lens" not in logit.fields() and "skip_punctuation" not in logit.fields()    # set by it; named punct
    assert list(logit.fields())[-2:] == ["start", "punct"]
    assert set(views.tab_fields("generate")) == set(FROZEN["generate"])      # its request's order (it had its own)
    extra = views.TabView("x", "generate", omits=("seed",), extras=((views.METRIC, "lens"), (views.START, "")))
    names = list(extra.fields())
    assert names[names.index("lens") + 1] == "metric" and names[-1] == "start" and "seed" not in names


def test_a_tabs_values_ask_what_the_api_asks_of_the_same_values():
    values = {"prompt": "The capital of France is", "layers": "20-29", "k": "3", "targets": "Paris, Rome",
              "metric": "kl", "punct": True, "start": 4}
    req = TAB_VIEWS["logit"].request(values, lens="logit")
    assert req == KINDS["lens"].request_of({"prompt": values["prompt"], "lens": "logit", "layers": "20-29", "k": "3",
                                            "targets": "Paris, Rome", "skip_punctuation": True})
    generate = TAB_VIEWS["generate"].request({"prompt": "Hi", "max_tokens": 3, "seed": ""})
    assert (generate.max_tokens, generate.seed, generate.lens) == (3, None, f.LENS.default)


def test_a_spread_field_takes_numbered_boxes_both_ways():
    compare = TAB_VIEWS["compare"]
    assert compare.input_names()[:4] == ["prompt1", "prompt2", "prompt3", "prompt4"]
    values = compare.values_of(View(tab="compare", prompts=("a", "b", "c")))
    assert [values[f"prompt{i}"] for i in range(1, 5)] == ["a", "b", "c", ""]
    assert compare.view_of({**values, "prompt2": "  "}).prompts == ("a", "c")         # an emptied box is skipped
    assert compare.request(values).prompts == ("a", "b", "c")


def test_a_view_of_half_typed_inputs_keeps_the_defaults_of_what_it_cannot_read():
    view = TAB_VIEWS["generate"].view_of({"prompt": "Hi", "max_tokens": "", "k": "x", "seed": 10**5000})
    assert (view.prompt, view.max_tokens, view.k, view.seed) == ("Hi", f.MAX_TOKENS.default, f.K.default, None)
    assert view == view.replace() and view.replace(k=4).k == 4 and view.k == f.K.default
    with pytest.raises(TypeError):
        View(tab="logit", colour="red")


def test_a_fields_widget_comes_from_the_field():
    assert form.widget_kind(f.LENS)[0] is gr.Radio
    assert form.widget_kind(f.CHAT)[0] is gr.Checkbox
    assert form.widget_kind(f.SEED) == (gr.Number, {"minimum": 0, "maximum": config.MAX_SEED, "precision": 0})
    assert form.widget_kind(f.CHAT_LAYER) == (gr.Number, {"precision": 0})      # int | None: a whole number
    assert form.widget_kind(f.PROMPT)[0] is gr.Textbox and form.widget_kind(f.ALPHAS)[0] is gr.Textbox
    assert form.widget_kind(f.MAX_TOKENS)[0] is gr.Slider and form.widget_kind(f.CHAT_MAX_TOKENS)[0] is gr.Slider


def test_a_lens_choice_is_offered_only_where_the_app_has_it():
    bare, loaded = SimpleNamespace(jlens=None), SimpleNamespace(jlens=object())
    assert form.choices_of(f.LENS, loaded) == [("logit lens", "logit"), ("Jacobian lens", "jacobian"),
                                               ("both", "both")]
    assert form.choices_of(f.LENS, bare) == [("logit lens", "logit")]
    assert form.choices_of(f.CHAT_LENS, bare) == [("logit lens", "logit")]
    assert [v for _, v in form.choices_of(f.DIRECTION, bare)] == list(f.DIRECTION.choices)   # not a lens: all
    with pytest.warns(UserWarning):                                          # gr.Warning outside a request
        assert form.available_lens(bare, "both") == "logit"
    assert form.available_lens(loaded, "both") == "both" and form.available_lens(bare, "tuned") == "tuned"


def test_a_forms_inputs_are_its_views_fields_with_their_labels_and_defaults():
    with gr.Blocks():
        made = form.Form(TAB_VIEWS["intervene"], SimpleNamespace(jlens=None))
        made.add("layer", label="Layer here")
        rest = made.rest()
    assert set(made.inputs) == set(TAB_VIEWS["intervene"].input_names()) and "layer" not in rest
    assert made.inputs["layer"].label == "Layer here" and made.inputs["layer"].value == views.DEFAULT_SPAN
    assert made.inputs["word"].label == f.WORD.label and made.inputs["word"].value == views.DEFAULT_WORD
    assert made.inputs["alphas"].value == views.as_text(f.ALPHAS.default)                # a tuple, as text
    assert made.inputs["intervention"].choices == [(c, c) for c in f.KIND.choices]
    assert made.inputs["lens"].choices == [("logit lens", "logit")] and made.inputs["lens"].value == "logit"

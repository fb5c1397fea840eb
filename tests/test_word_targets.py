"""A target whose first token is only whitespace is read as the word: " 19" is ␣, 1, 9 to the embedded model's
tokenizer (SmolLM2's: a number's space is a token of its own), and the space's probability says nothing of 19.
Such a target is read whole (its whole word's probability at the last position), and every chart and line that
shows it says so. On the tiny service: a random model with the embedded tokenizer, so the tokens are real."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lensapp.charts import Grid
from lensapp.charts.lens import target_rows
from lensapp.results.readout import bare_first
from lensapp.service import LensRequest
from lensapp.ui.readout import lens_summary

ARITHMETIC = "12 + 7 ="


@pytest.fixture(scope="module")
def read(tiny_service):
    return tiny_service.lens(LensRequest(prompts=(ARITHMETIC,), lens="logit", targets=("19", "Paris")))[0]


def test_a_number_after_a_space_is_read_whole_and_a_word_by_its_first_token(read):
    nineteen, paris = read.lenses["logit"].targets
    assert nineteen.tokens == [" ", "1", "9"] and bare_first(nineteen.tokens)
    assert paris.tokens == [" Paris"] and not bare_first(paris.tokens)
    whole = np.exp(nineteen.continuation_logprob)
    grid = Grid.from_lens(read, "logit")
    colour = grid.metric_values("target_prob", 0)
    assert np.allclose(colour[:, -1], whole) and np.isnan(colour[:, :-1]).all()     # only where the word is read
    assert (grid.metric_values("target_rank", 0) == 0).all()                          # no token there is the word
    assert (whole <= nineteen.probs[:, -1]).all()            # the word is ␣ then 1 then 9: never likelier than ␣
    assert (grid.metric_values("target_prob", 1) == paris.probs).all()                # a word: its first token
    assert nineteen.to_json()["scored_as"].startswith("whole word at the last position")


def test_the_whole_word_is_the_models_own_probability_of_it(read, tiny_model_dir):
    """At the last layer the logit lens is the model: the whole word there is P(␣) P(1 | ␣) P(9 | ␣1), computed
    here with plain transformers on the ids the app read."""
    from transformers import AutoModelForCausalLM

    nineteen = read.lenses["logit"].targets[0]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    ids = list(read.input_ids) + nineteen.token_ids[:-1]
    with torch.no_grad():
        logprobs = model(torch.tensor([ids])).logits[0].log_softmax(-1)
    start = len(read.input_ids) - 1
    want = sum(float(logprobs[start + i, t]) for i, t in enumerate(nineteen.token_ids))
    assert np.exp(nineteen.continuation_logprob[-1]) == pytest.approx(np.exp(want), rel=1e-3)


def test_the_summary_and_the_curves_name_the_whole_word_never_the_space(read):
    summary = lens_summary(read, ("logit",))
    (line,) = [s for s in summary.splitlines() if "19" in s]
    assert "read whole" in line and "P(␣)" not in line
    last, earlier = len(read.input_ids) - 1, len(read.input_ids) - 2
    nineteen = read.lenses["logit"].targets[0]
    rows = [r for r in target_rows(read, "logit", last) if r["target"].startswith("19")]
    assert {r["target"] for r in rows} == {"19 (whole word)"}
    assert np.allclose([r["prob"] for r in rows], np.exp(nineteen.continuation_logprob))
    assert {r["prob"] for r in target_rows(read, "logit", earlier) if r["target"] == "19"} == {None}

"""Skipping punctuation (results/punctuation.py), the cells it draws, and the heatmap as a table: no model."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lensapp import charts
from lensapp.results import LensReadout, LensResult, dumps
from lensapp.results.punctuation import NONE_FOUND, is_punctuation, pick_display


@pytest.mark.parametrize("token", [".", ",", " ", "\n", " .", ",\"", "...", "  \t", "", "→", "$", "\ufffd", "—", "¿"])
def test_punctuation_symbols_and_whitespace_are_skipped(token):
    assert is_punctuation(token)


@pytest.mark.parametrize("token", [" the", "Paris", " city", "3", " 1999", "é", "東京", "<|im_end|>", " a.", "x,"])
def test_words_numbers_and_special_tokens_are_not(token):
    assert not is_punctuation(token)


def test_the_best_word_is_picked_with_its_rank_and_none_found_is_rank_zero():
    tokens = [[[" the", ".", " a"], [".", ",", " city"]],
              [["\n", " ", "!"], [" Paris", ".", " Rome"]]]
    probs = np.array([[[.5, .3, .2], [.6, .3, .1]], [[.7, .2, .1], [.4, .3, .2]]], dtype=np.float32)
    shown, ranks = pick_display(tokens, probs)
    assert shown == [[" the", " city"], ["\n", " Paris"]]
    assert ranks.tolist() == [[1, 3], [NONE_FOUND, 1]]


def raw_readout(tokens: list[list[list[str]]], vocab: list[str]) -> dict:
    """A readout as the engine returns one (tensors), over `vocab`: descending probabilities."""
    ids = torch.tensor([[[vocab.index(t) for t in pos] for pos in layer] for layer in tokens])
    L, P, w = ids.shape
    probs = torch.linspace(0.5, 0.01, w).expand(L, P, w).clone()
    return {"top_ids": ids, "top_probs": probs, "entropy": torch.ones(L, P), "kl_to_final": torch.zeros(L, P)}


VOCAB = [".", ",", " ", " the", " city", " Paris", "\n"]
WIDE = [[[".", ",", " city", " the"], [" the", ".", ",", " "]],
        [[".", ",", " ", "\n"], [" Paris", " city", ".", ","]]]


def readout(skip: bool, k: int = 2) -> LensReadout:
    return LensReadout.from_readout(raw_readout(WIDE, VOCAB), lambda ids: [VOCAB[i] for i in ids], k=k,
                                    skip_punctuation=skip)


def test_a_readout_keeps_the_true_top_k_and_picks_its_display_from_the_wider_read():
    r = readout(skip=True)
    assert r.top_ids.shape == (2, 2, 2) and r.top_tokens[0][0] == [".", ","]       # the true top-k, cut to k
    assert r.display_tokens == [[" city", " the"], [".", " Paris"]]               # found at rank 3, beyond k
    assert r.display_ranks.tolist() == [[3, 1], [0, 1]] and r.searched == 4
    assert r.display_probs[0, 0] == pytest.approx(float(torch.linspace(0.5, 0.01, 4)[2]))
    plain = readout(skip=False)
    assert plain.display_ranks is None and plain.top_tokens == r.top_tokens
    assert "display_tokens" not in plain.to_json()


def result(skip: bool) -> LensResult:
    return LensResult(prompt="a b", input_ids=[0, 1], input_tokens=["a", " b"], layers=[3, 7],
                      lenses={"logit": readout(skip)}, model_next_id=0, model_next_token=" Paris")


def test_the_json_carries_display_tokens_and_ranks():
    lens = json.loads(dumps(result(True)))["lenses"]["logit"]
    assert lens["display_tokens"] == [[" city", " the"], [".", " Paris"]]
    assert lens["display_ranks"] == [[3, 1], [0, 1]] and lens["display_searched"] == 4
    assert np.array(lens["top_probs"]).shape == (2, 2, 2)


def test_the_heatmap_shows_the_word_marked_by_its_rank_and_keeps_the_true_top_k_in_the_tooltip():
    d = charts.lens_heatmap(result(True)).to_dict()
    rows = {(r["layer"], r["position"]): r for r in d["data"]["values"]}
    assert rows[3, 0]["top1"] == "␣city³" and rows[3, 0]["t1"].startswith(".")     # true #1 on hover
    assert "skipping punctuation: rank 3" in rows[3, 0]["shown"]
    assert rows[7, 0]["top1"] == "." and "no word in the top 4" in rows[7, 0]["shown"]
    assert rows[3, 1]["top1"] == "␣the"
    plain = charts.lens_heatmap(result(False)).to_dict()
    rows = {(r["layer"], r["position"]): r for r in plain["data"]["values"]}
    assert rows[3, 0]["top1"] == "." and "shown" not in rows[3, 0]


def test_a_highlight_outlines_the_cells_it_names():
    hl = charts.Highlight(layers=frozenset({7}), tokens=frozenset({" Paris"}))
    d = charts.lens_heatmap(result(True), highlight=hl).to_dict()
    assert [m["mark"]["type"] for m in d["layer"]] == ["rect", "text", "rect", "rect"]
    assert d["layer"][3]["mark"]["filled"] is False
    noted = [(r["layer"], r["position"]) for r in d["data"]["values"] if r["noted"]]
    assert noted == [(7, 1)]
    assert [m["mark"]["type"] for m in charts.lens_heatmap(result(True)).to_dict()["layer"]] == ["rect", "text"]


def test_the_table_alternative_reads_every_cell_as_text():
    table = charts.lens_table(result(True))
    assert list(table.index) == [7, 3] and list(table.columns) == ["0: a", "1: ␣b"]     # top layer first
    assert table.loc[3, "0: a"].startswith("␣city (p=") and table.loc[3, "0: a"].endswith(", rank 3)")
    assert "no word in the top 4" in table.loc[7, "0: a"]
    assert charts.lens_table(result(False)).loc[3, "0: a"].startswith(". (p=0.50")

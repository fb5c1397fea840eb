"""Where each token was decided (results/decided.py): hand-worked grids, a naive recomputation, and the strip's
place in a result's JSON and CSV."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pytest
import torch

from lensapp.results import LensReadout, LensResult
from lensapp.results.decided import NEVER, decided_rows, holds, summary


def naive(top_ids, top_probs, tokens, rule):
    """The definition read literally: the smallest row r such that every row from r to the last holds."""
    L, P, _ = top_ids.shape
    out = []
    for p in range(P):
        def ok(layer, t=tokens[p], p=p):
            ids, probs = list(top_ids[layer, p]), list(top_probs[layer, p])
            if rule == "top5":
                return t in ids[:5]
            if t not in ids or probs[ids.index(t)] < probs[0]:
                return False
            return rule == "top1" or probs[ids.index(t)] > 0.5
        first = NEVER
        for r in range(L - 1, -1, -1):
            if not ok(r):
                break
            first = r
        out.append(first)
    return out


def test_a_hand_worked_column():
    # one position, 4 layers, top-2: the token 7 is top-1 at rows 1 and 3, second at row 2, absent at row 0
    ids = np.array([[[1, 2]], [[7, 1]], [[1, 7]], [[7, 3]]])
    probs = np.array([[[0.5, 0.2]], [[0.6, 0.1]], [[0.4, 0.3]], [[0.9, 0.05]]])
    tokens = np.array([7])
    assert decided_rows(ids, probs, tokens, "top1").tolist() == [3]          # row 2 breaks the run
    assert decided_rows(ids, probs, tokens, "p50").tolist() == [3]
    probs[2, 0] = [0.35, 0.35]                                                 # a tie with the top-1 counts for it
    assert decided_rows(ids, probs, tokens, "top1").tolist() == [1]
    assert decided_rows(ids, probs, tokens, "p50").tolist() == [3]            # 0.6 at row 1, but 0.35 at row 2
    assert decided_rows(ids, probs, np.array([3]), "top1").tolist() == [NEVER]


def test_rules_against_the_definition_on_random_grids():
    rng = np.random.default_rng(0)
    for _ in range(50):
        L, P, k, vocab = rng.integers(1, 8), rng.integers(1, 6), rng.integers(5, 8), 9
        ids = np.stack([[rng.permutation(vocab)[:k] for _ in range(P)] for _ in range(L)])
        probs = np.sort(rng.dirichlet(np.ones(vocab) * 0.3, size=(L, P))[..., :k], axis=-1)[..., ::-1]
        tokens = rng.integers(0, vocab, size=P)
        for rule in ("top1", "top5", "p50"):
            assert decided_rows(ids, probs, tokens, rule).tolist() == naive(ids, probs, tokens, rule)


def test_the_rules_nest_and_bad_shapes_say_so():
    rng = np.random.default_rng(1)
    ids = np.stack([[rng.permutation(20)[:6] for _ in range(4)] for _ in range(10)])
    probs = np.sort(rng.dirichlet(np.ones(20) * 0.2, size=(10, 4))[..., :6], axis=-1)[..., ::-1]
    tokens = ids[-1, :, 0]
    top1, top5, p50 = (decided_rows(ids, probs, tokens, r) for r in ("top1", "top5", "p50"))
    # holding p > 0.5 implies top-1 implies top-5: a stricter rule settles no earlier
    assert all(t5 <= t1 for t5, t1 in zip(top5, top1))
    assert all(p == NEVER or p >= t1 for p, t1 in zip(p50, top1))
    with pytest.raises(ValueError, match="top-5 rule needs k >= 5"):
        holds(ids[..., :3], probs[..., :3], tokens, "top5")
    with pytest.raises(ValueError, match="do not match"):
        decided_rows(ids, probs, tokens[:2])


def test_summary_names_the_latest_decided():
    s = summary([3, None, 12, 12, 0], ["a", "b", "c", "d", "e"])
    assert s == {"decided": 4, "undecided": 1, "mean_layer": 6.75,
                 "latest": [{"position": 2, "token": "c", "layer": 12}, {"position": 3, "token": "d", "layer": 12},
                            {"position": 0, "token": "a", "layer": 3}]}
    assert summary([None], ["x"])["mean_layer"] is None


def _readout(ids, probs, final=None) -> dict:
    L, P, _ = ids.shape
    raw = {"top_ids": torch.tensor(ids), "top_probs": torch.tensor(probs, dtype=torch.float32),
           "entropy": torch.ones(L, P), "kl_to_final": torch.zeros(L, P)}
    if final is not None:
        raw["final_top_id"] = torch.tensor(final).expand(L, P)
    return raw


def test_a_results_json_and_csv_carry_the_strip():
    ids = np.array([[[5, 6, 7, 8, 9], [1, 2, 3, 4, 5]], [[6, 5, 7, 8, 9], [2, 1, 3, 4, 5]],
                    [[6, 5, 7, 8, 9], [1, 2, 3, 4, 5]]])
    probs = np.tile(np.array([0.6, 0.2, 0.1, 0.05, 0.05]), (3, 2, 1))
    decode = lambda xs: [f"t{i}" for i in xs]          # noqa: E731
    readout = LensReadout.from_readout(_readout(ids, probs, final=[6, 1]), decode, k=2)
    result = LensResult(prompt="p", input_ids=[10, 11], input_tokens=["a", "b"], layers=[4, 8, 29],
                        lenses={"logit": readout}, model_next_id=1, model_next_token="t1")
    lens = result.to_json()["lenses"]["logit"]
    assert lens["decided_at"] == [8, 29]               # 6 is top-1 from layer 8; 1 only at the last layer
    assert lens["decided_at_top5"] == [4, 4]           # read from the worker's top-5 before k=2 cut it
    assert lens["decided_at_p50"] == [8, 29]
    assert lens["decided_tokens"] == ["t6", "t1"] and lens["top_ids"][0][0] == [5, 6]
    assert lens["decided_summary"]["latest"][0] == {"position": 1, "token": "t1", "layer": 29}
    csv = pd.read_csv(io.StringIO(result.to_csv()))
    assert list(csv.columns[-3:]) == ["decided_at", "decided_at_top5", "decided_at_p50"]
    assert csv.groupby("position")["decided_at"].first().tolist() == [8, 29]
    # without the engine's final top-1, the last row's own top-1 is the token decided
    plain = LensReadout.from_readout(_readout(ids, probs), decode)
    assert plain.decided_ids.tolist() == [6, 1]


def test_a_token_that_never_settles_is_empty_in_the_csv():
    ids = np.array([[[1, 2]], [[2, 1]]])
    probs = np.array([[[0.5, 0.4]], [[0.5, 0.4]]])
    readout = LensReadout.from_readout(_readout(ids, probs, final=[1]), lambda xs: [str(i) for i in xs])
    result = LensResult(prompt="p", input_ids=[3], input_tokens=["x"], layers=[0, 1], lenses={"logit": readout},
                        model_next_id=1, model_next_token="1")
    assert result.decided_at("logit") == [None]
    assert "top5" not in readout.decisions()                 # two tokens read: the top-5 rule has nothing to say
    row = pd.read_csv(io.StringIO(result.to_csv())).iloc[0]
    assert pd.isna(row["decided_at"]) and "decided_at_top5" not in row

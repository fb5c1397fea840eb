"""Skipping punctuation on vLLM (the embedded model): what changes, what does not, and the same cells from the
page's handler, the API's endpoint and the command line."""

from __future__ import annotations

import json

import pytest

from lensapp import cli, config
from lensapp.config import PUNCTUATION_WIDTH
from lensapp.results.punctuation import is_punctuation
from lensapp.service import LensRequest, LensService
from lensapp.service.limits import RateLimiter
from lensapp.ui import api, build_ui
from lensapp.ui.guard import Guard
from lensapp.ui.kept import value_of

PROMPT = "The Eiffel Tower is in the city of"


@pytest.fixture(scope="module")
def both(vllm_service):
    plain = vllm_service.lens(LensRequest(prompts=(PROMPT,), k=5))[0].lenses["logit"]
    skip = vllm_service.lens(LensRequest(prompts=(PROMPT,), k=5, skip_punctuation=True))[0]
    return plain, skip


def test_skipping_changes_the_punctuation_cells_and_nothing_else(both):
    plain, result = both
    r = result.lenses["logit"]
    L, P = r.display_ranks.shape
    assert (L, P) == (len(result.layers), len(result.input_ids)) and r.searched == PUNCTUATION_WIDTH
    top1 = [[pos[0] for pos in layer] for layer in plain.top_tokens]
    punctuation = [(i, p) for i in range(L) for p in range(P) if is_punctuation(top1[i][p])]
    assert len(punctuation) >= 3, top1                          # the picture this option is for
    moved = [(i, p) for i, p in punctuation if r.display_ranks[i, p] > 1]
    assert moved and all(r.display_tokens[i][p] != top1[i][p] for i, p in moved)
    for i in range(L):
        for p in range(P):
            rank = int(r.display_ranks[i, p])
            assert (rank == 0 and is_punctuation(r.display_tokens[i][p])) or not is_punctuation(r.display_tokens[i][p])
            if rank == 1:
                assert r.display_tokens[i][p] == top1[i][p]
    # the true top-k (what a hover shows), entropy and KL are the plain request's
    assert r.top_tokens == plain.top_tokens and r.top_ids.tolist() == plain.top_ids.tolist()
    assert r.top_probs == pytest.approx(plain.top_probs, abs=1e-5)
    assert r.entropy == pytest.approx(plain.entropy, abs=1e-4)
    assert plain.display_ranks is None


def page_cells(plot) -> dict:
    """(layer, position) -> the text a page's heatmap draws in the cell."""
    spec = json.loads(plot.plot)
    rows = spec["data"]["values"] if "values" in spec.get("data", {}) else next(iter(spec["datasets"].values()))
    return {(row["layer"], row["position"]): row["top1"] for row in rows}


def test_the_page_the_api_and_the_cli_show_the_same_cells(both, vllm_service, monkeypatch, capsys):
    from lensapp.charts.grid import DisplaySettings, cell_text

    _, result = both
    expected = result.to_json()["lenses"]["logit"]
    page = build_ui(vllm_service, config.WebSettings(), config.LimitSettings(rate_limit=0)).tabs["logit"]
    out = page.run({"prompt": PROMPT, "layers": "all", "k": 5, "targets": "", "metric": "top1_prob", "chat": False,
                    "raw": False, "start": None, "punct": True})
    assert value_of(out["state"]).to_json()["lenses"]["logit"]["display_tokens"] == expected["display_tokens"]
    drawn = page_cells(out["heatmap"])
    settings = DisplaySettings()
    for i, layer in enumerate(result.layers):
        for p in range(len(result.input_ids)):
            assert drawn[layer, p] == cell_text(expected["display_tokens"][i][p], expected["display_ranks"][i][p],
                                                settings)
    assert "rank " in out["grid_table"] and "<table>" in out["grid_table"]                      # the table alternative

    endpoint = next(e for e in api.endpoints() if e.name == "lens")
    answer = api.endpoint_function(endpoint, vllm_service, Guard(RateLimiter(0)))(PROMPT, skip_punctuation=True)
    assert {key: answer["lenses"]["logit"][key] for key in ("display_tokens", "display_ranks", "top_tokens")} == \
        {key: expected[key] for key in ("display_tokens", "display_ranks", "top_tokens")}

    # the command line's own path (flags, request, check, JSON) on the session's engine, not a second one
    monkeypatch.setattr(LensService, "start", classmethod(lambda cls, cfg, start_engine=True: vllm_service))
    monkeypatch.setattr(vllm_service, "close", lambda: None)
    assert cli.main(["lens", PROMPT, "--skip-punctuation", "--json", "--jlens", "none"]) == 0
    printed = json.loads(capsys.readouterr().out)["lenses"]["logit"]
    assert (printed["display_tokens"], printed["display_ranks"]) == (expected["display_tokens"],
                                                                    expected["display_ranks"])
    assert cli.main(["lens", PROMPT, "--skip-punctuation", "--jlens", "none", "--layers", "20-29"]) == 0
    assert "skipping punctuation: the best word per cell" in capsys.readouterr().out

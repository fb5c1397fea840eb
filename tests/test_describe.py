"""Describe a cell in words (service/describing.py): the request, its JSON, and, on the tiny transformers
service, the same tokens as Patchscopes written again on plain transformers (tests/patchscope_reference.py).
The embedded model on vLLM is judged by the same reference in test_road_vllm.py."""

from __future__ import annotations

import json

import pytest
from patchscope_reference import describe as reference
from patchscope_reference import greedy, load

from lensapp import cli
from lensapp.results import dumps
from lensapp.service import DescribeRequest
from lensapp.service.describing import IDENTITY_PROMPT
from lensapp.service.field import RequestError

PROMPT = "A small brown dog sat"
KEYS = ["layer", "position", "inspection_prompt", "inspect_layer", "inspect_position", "tokens", "text"]


def test_the_command_line_reads_the_issue_contract():
    args = cli.build_parser().parse_args(["describe", PROMPT, "--layer", "all", "--position", "2", "--max-tokens",
                                          "4", "--inspect", "x -> x; ?", "--json"])
    req = cli.request_of(args)
    assert isinstance(req, DescribeRequest) and req.layer.is_all and req.position == 2 and req.max_tokens == 4
    assert req.inspect == "x -> x; ?" and req.inspect_layer is None and args.json


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    return load(tiny_model_dir)


def test_a_description_is_what_the_reference_says(tiny_service, hf_model):
    ids = tiny_service.prompts.ids(PROMPT)
    inspect_ids = tiny_service.prompts.ids(IDENTITY_PROMPT)
    one = tiny_service.describe(DescribeRequest(prompt=PROMPT, layer="1", position=-2, max_tokens=5))
    answer = json.loads(dumps(one))
    assert list(answer)[:len(KEYS)] == KEYS and answer["layer"] == 1 and answer["position"] == len(ids) - 2
    assert answer["inspection_prompt"] == IDENTITY_PROMPT and answer["inspect_layer"] == 1
    assert answer["inspect_position"] == len(inspect_ids) - 1 and len(answer["tokens"]) == 5
    assert answer["token_ids"] == reference(hf_model, ids, 1, len(ids) - 2, inspect_ids, 1, 5)
    # the state really is used: another position describes differently at some layer of the sweep
    sweep = tiny_service.describe(DescribeRequest(prompt=PROMPT, layer="all", position=1, max_tokens=5,
                                                  inspect_layer=2))
    listed = sweep.to_json()
    assert isinstance(listed, list) and [d["layer"] for d in listed] == [0, 1, 2, 3]
    for d in listed:
        assert d["inspect_layer"] == 2
        assert d["token_ids"] == reference(hf_model, ids, d["layer"], 1, inspect_ids, 2, 5), d["layer"]
    unpatched = greedy(hf_model, inspect_ids, 5)
    assert any(d["token_ids"] != unpatched for d in listed + [answer])


def test_a_description_of_a_cell_outside_the_prompt_says_so(tiny_service):
    for req, says in [(DescribeRequest(prompt=PROMPT, layer="9"), "layer 9 is outside"),
                      (DescribeRequest(prompt=PROMPT, layer="1", position=40), "position 40 is outside"),
                      (DescribeRequest(prompt=PROMPT, layer="1", inspect_layer=-9), "inspect_layer -9 is outside")]:
        with pytest.raises(RequestError, match=says):
            tiny_service.check(req)
    assert tiny_service.check(DescribeRequest(prompt=PROMPT, layer="all")).forwards == 1 + 4


def test_requests_with_edits_are_salted_should_prefix_caching_ever_be_on(monkeypatch):
    """Every description of a sweep sends the same inspection prompt: with vLLM's prefix cache on, the second
    would reuse the first one's keys and values (another state at the placeholder). The app runs it off; were
    it on, each request with edits gets a salt of its own, and a plain one none."""
    import torch

    from lensapp.engine.run import vllm_backend
    from lensapp.engine.run.edit import Edit

    edit = (Edit(3, "replace", torch.zeros(1, 8), positions=(2,)),)
    assert vllm_backend.PREFIX_CACHING is False and vllm_backend._prompt((1, 2, 3), edit) == [1, 2, 3]
    monkeypatch.setattr(vllm_backend, "PREFIX_CACHING", True)
    a, b = vllm_backend._prompt((1, 2, 3), edit), vllm_backend._prompt((1, 2, 3), edit)
    assert a["prompt_token_ids"] == b["prompt_token_ids"] == [1, 2, 3] and a["cache_salt"] != b["cache_salt"]
    assert vllm_backend._prompt((1, 2, 3), ()) == [1, 2, 3]

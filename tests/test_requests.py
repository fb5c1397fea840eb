"""Requests read through their fields (service/requests.py) and layer selections against a model (planning)."""

import pytest

from lensapp.service.fields import RequestError
from lensapp.service.requests import ChatRequest, GenerateRequest, LensRequest
from lensapp.service.selection import Selection


def parse_layers(text, n, allowed=None):
    """The one grammar: a selection's text, then its indices in an n-long thing."""
    return Selection(text).resolve(n, allowed=allowed)


def test_parse_layers_forms():
    assert parse_layers("all", 4) == [0, 1, 2, 3]
    assert parse_layers("", 4) == [0, 1, 2, 3]
    assert parse_layers("0, 2,-1", 30) == [0, 2, 29]
    assert parse_layers("10-12", 30) == [10, 11, 12]
    assert parse_layers("-3--1", 30) == [27, 28, 29]
    assert parse_layers("last", 30) == [29]
    assert parse_layers("all", 30, allowed=[5, 3, 29]) == [3, 5, 29]


@pytest.mark.parametrize("text", ["30", "-31", "x", "5-2", "1.5", "0,,abc", "1-2-3"])
def test_parse_layers_rejects(text):
    with pytest.raises(RequestError):
        parse_layers(text, 30)


def test_parse_layers_outside_the_lens():
    with pytest.raises(RequestError, match="Jacobian lens"):
        parse_layers("4", 30, allowed=[3, 5, 29])


@pytest.mark.parametrize("prompts,lens,k,targets,msg", [
    ([""], "logit", 5, (), "empty"), (["  "], "logit", 5, (), "empty"), ([], "logit", 5, (), "no prompt"),
    (["x"], "tuned", 5, (), "lens must be"), (["x"], "logit", 0, (), "k must"), (["x"], "logit", 101, (), "k must"),
    (["x" * 20001], "logit", 5, (), "characters"), (["x"], "logit", 5, (7,), "targets must be"),
    (["x"], "logit", 5, ("Paris" + " x" * 100,), "the limit is 200"), (["x"], "logit", 5, ("a",) * 9, "at most 8"),
    (["a\x00b"], "logit", 5, (), "control characters"),
])
def test_a_request_built_in_code_is_checked_like_one_read_from_text(prompts, lens, k, targets, msg):
    with pytest.raises(RequestError, match=msg):
        LensRequest(prompts=tuple(prompts), lens=lens, k=k, targets=tuple(targets))


def test_parse_reads_text_the_way_every_surface_sends_it():
    req = LensRequest.parse(prompts=["Hi"], k="7", targets="Paris, Rome", chat="1", layers=None)
    assert req == LensRequest(prompts=("Hi",), k=7, targets=("Paris", "Rome"), chat=True, layers="all")
    assert LensRequest(**vars(req)) == req                        # reading a read request changes nothing
    gen = GenerateRequest.parse(prompt="x", max_tokens="3", temperature="0.5", seed="")
    assert (gen.max_tokens, gen.temperature, gen.seed, gen.sampled) == (3, 0.5, None, True)
    assert not GenerateRequest(prompt="x").sampled
    for bad in ({"max_tokens": 0}, {"max_tokens": 65}, {"temperature": -1.0}, {"seed": -1}):
        with pytest.raises(RequestError):
            GenerateRequest.parse(prompt="x", **bad)
    chat = ChatRequest.parse(messages=[{"role": "user", "content": "Hi"}], layer="-3")
    assert chat.layer == -3 and chat.k == 3 and chat.max_tokens == 32
    with pytest.raises(TypeError, match="no field"):
        LensRequest.parse(prompts=["x"], colour="red")

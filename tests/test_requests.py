import pytest

from lensapp.service.requests import (
    GenerateRequest,
    LensRequest,
    RequestError,
    parse_layers,
    validate_generate,
    validate_lens,
)


def test_parse_layers_forms():
    assert parse_layers("all", 4) == [0, 1, 2, 3]
    assert parse_layers("", 4) == [0, 1, 2, 3]
    assert parse_layers("0, 2,-1", 30) == [0, 2, 29]
    assert parse_layers("10-12", 30) == [10, 11, 12]
    assert parse_layers("-3--1", 30) == [27, 28, 29]
    assert parse_layers("last", 30) == [29]
    assert parse_layers("all", 30, allowed=[5, 3, 29]) == [3, 5, 29]


@pytest.mark.parametrize("text", ["30", "-31", "x", "5-2", "1.5", "0,,abc"])
def test_parse_layers_rejects(text):
    with pytest.raises(RequestError):
        parse_layers(text, 30)


def test_parse_layers_outside_the_lens():
    with pytest.raises(RequestError, match="Jacobian lens"):
        parse_layers("4", 30, allowed=[3, 5, 29])


@pytest.mark.parametrize("prompts,lens,k,targets,msg", [
    ([""], "logit", 5, (), "empty"), (["  "], "logit", 5, (), "empty"), ([], "logit", 5, (), "no prompt"),
    (["x"], "tuned", 5, (), "lens must be"), (["x"], "logit", 0, (), "k must"), (["x"], "logit", 101, (), "k must"),
    (["x" * 20001], "logit", 5, (), "characters"), (["x"], "logit", 5, ("",), "target is empty"),
    (["x"], "logit", 5, ("Paris" + " x" * 100,), "the limit is 200"), (["x"], "logit", 5, ("a",) * 9, "at most 8"),
])
def test_validate_lens(prompts, lens, k, targets, msg):
    with pytest.raises(RequestError, match=msg):
        validate_lens(LensRequest(prompts=tuple(prompts), lens=lens, k=k, targets=tuple(targets)))


def test_validate_generate():
    validate_generate(GenerateRequest(prompt="x", max_tokens=3))
    for bad in (GenerateRequest(prompt="x", max_tokens=0), GenerateRequest(prompt="x", max_tokens=65),
                GenerateRequest(prompt="x", temperature=-1.0)):
        with pytest.raises(RequestError):
            validate_generate(bad)

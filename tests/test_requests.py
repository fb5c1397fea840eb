import pytest

from lensapp.engine.requests import GenerateRequest, RequestError, parse_layers, plan_batches, validate_common, validate_generate


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
def test_validate_common(prompts, lens, k, targets, msg):
    with pytest.raises(RequestError, match=msg):
        validate_common(prompts, lens, k, targets)


def test_validate_generate():
    validate_generate(GenerateRequest(prompt="x", max_tokens=3))
    for bad in (GenerateRequest(prompt="x", max_tokens=0), GenerateRequest(prompt="x", max_tokens=65),
                GenerateRequest(prompt="x", temperature=-1.0)):
        with pytest.raises(RequestError):
            validate_generate(bad)


def test_plan_batches_keeps_order_and_limits():
    assert plan_batches([5, 5, 5], max_batch=2, max_tokens=100) == [[0, 1], [2]]
    assert plan_batches([60, 50, 10], max_batch=8, max_tokens=100) == [[0], [1, 2]]
    assert plan_batches([500, 1], max_batch=8, max_tokens=100) == [[0], [1]]      # too long: alone, still runs
    assert plan_batches([], max_batch=8, max_tokens=100) == []
    flat = [i for b in plan_batches([3] * 40, 16, 1000) for i in b]
    assert flat == list(range(40))

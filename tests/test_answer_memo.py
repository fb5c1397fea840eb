"""A result answered again through the queue is not made into JSON again (ui/answer_memo.py), and its answer is
the same JSON the first one was."""

from __future__ import annotations

import gc
from types import SimpleNamespace

import orjson
import pytest

from lensapp.ui import api
from lensapp.ui.answer_memo import AnswerMemo


class Result:
    """Stands for a result object: weakly referable, like the results' dataclasses."""


def counted(data: bytes):
    calls = []

    def make():
        calls.append(1)
        return data
    return make, calls


def test_a_result_answered_again_is_not_made_again():
    memo, result = AnswerMemo(1000), Result()
    make, calls = counted(b'{"a": 1}')
    assert memo.json_of(result, make) == memo.json_of(result, make) == b'{"a": 1}'
    assert len(calls) == 1 and (memo.hits, memo.misses, memo.bytes) == (1, 1, 8)
    other = Result()                                   # another object, the same request: made for it
    assert memo.json_of(other, make) == b'{"a": 1}' and len(calls) == 2


def test_a_freed_result_takes_its_json_with_it():
    memo, result = AnswerMemo(1000), Result()
    memo.json_of(result, lambda: b"x" * 100)
    del result
    gc.collect()
    memo.json_of(Result(), lambda: b"y" * 10)          # the next call drops what was freed
    assert memo.bytes == 10


def test_the_bound_holds_and_the_least_recent_goes_first():
    memo = AnswerMemo(250)
    a, b, c = Result(), Result(), Result()
    memo.json_of(a, lambda: b"a" * 100)
    memo.json_of(b, lambda: b"b" * 100)
    memo.json_of(a, lambda: b"never made")             # a answered last: b is the least recent
    memo.json_of(c, lambda: b"c" * 100)
    assert memo.bytes == 200
    make, calls = counted(b"b" * 100)
    memo.json_of(b, make)
    assert calls == [1]                                # b went
    huge, made = Result(), counted(b"h" * 300)
    memo.json_of(huge, made[0]), memo.json_of(huge, made[0])
    assert len(made[1]) == 2 and memo.bytes <= 250     # larger than the bound: never kept


def test_a_json_over_the_bound_is_not_kept_and_the_others_stay():
    memo = AnswerMemo(250)
    kept = [Result() for _ in range(2)]
    for result in kept:
        memo.json_of(result, lambda: b"k" * 100)
    huge = Result()
    memo.json_of(huge, lambda: b"h" * 251)
    assert memo.bytes == 200
    make, calls = counted(b"never made")
    assert [memo.json_of(result, make) for result in kept] == [b"k" * 100] * 2 and calls == []


def test_what_cannot_be_referred_to_weakly_is_made_each_time():
    memo, make_calls = AnswerMemo(1000), counted(b"[]")
    listed = [1, 2]
    memo.json_of(listed, make_calls[0]), memo.json_of(listed, make_calls[0])
    assert len(make_calls[1]) == 2 and memo.bytes == 0


class _Guard:
    def api(self, request, fn, *args):
        return fn(*args)

    def answered(self, request, size):
        pass


@pytest.fixture
def cached_service(tiny_service):
    """The shared tiny service (which has no result cache) behind a cache of its own: the same request, the same
    result object, as the result cache gives."""
    kept = {}

    def lens(request):
        key = repr(request)
        if key not in kept:
            kept[key] = tiny_service.lens(request)
        return kept[key]
    return SimpleNamespace(lens=lens)


def test_a_cached_lens_answered_twice_through_the_queue_is_one_json(cached_service):
    memo = AnswerMemo(1 << 20)
    lens = next(kind for kind in api.endpoints() if kind.name == "lens")
    fn = api.endpoint_function(lens, cached_service, _Guard(), memo)
    queue = SimpleNamespace(url=SimpleNamespace(path="/gradio_api/queue/join"))
    ask = {"prompt": "The capital of France is", "lens": "logit", "layers": "all", "k": 3}
    first, again = orjson.dumps(fn(**ask, request=queue)), orjson.dumps(fn(**ask, request=queue))
    assert first == again and (memo.hits, memo.misses) == (1, 1)
    assert orjson.loads(first) == orjson.loads(orjson.dumps(fn(**ask)))    # the dict a call inside the app gets
    rest = SimpleNamespace(url=SimpleNamespace(path="/gradio_api/call/lens"))
    assert fn(**ask, request=rest) == orjson.loads(first) and memo.hits == 2    # the REST route: a dict, same JSON

"""Forced tokens (service/branching.py, results/branching.py): how a force is read, what a branch keeps from its
parent, and, on the tiny transformers service, that a branch's continuation is the generation of its prefix."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from lensapp.config import MAX_FORCES
from lensapp.engine.run.protocol import Sampling
from lensapp.results import GenerationResult
from lensapp.results.branching import changed_layers, parting
from lensapp.service import ChatRequest, GenerateRequest
from lensapp.service.field import RequestError
from lensapp.service.fields import FORCE
from lensapp.service.parsers import branches

PROMPT = "The capital of France is"


def test_a_force_is_a_step_and_a_token():
    assert FORCE("2=Paris") == ((2, "Paris"),)
    assert FORCE(["1= Rome", "3=#7042"]) == ((1, " Rome"), (3, 7042))      # the word's spaces are its own
    assert FORCE(["0==", "4=#"]) == ((0, "="), (4, "#"))                    # '#' without digits is a word
    assert FORCE("") == () and FORCE([]) == ()
    for bad, says in [("Paris", "STEP=WORD"), ("x=Paris", "whole number"), ("2=", "names no token"),
                      (["3=a", "1=b"], "must increase"), (["2=a", "2=b"], "must increase"), ("99=a", "0..63"),
                      ([f"{i}=a" for i in range(MAX_FORCES + 1)], f"at most {MAX_FORCES}"), (7, "STEP=WORD")]:
        with pytest.raises(RequestError, match=says):
            FORCE(bad)


def test_a_links_branches_are_chains_of_token_ids():
    parse = branches(8, 8, 63)
    assert parse("3=#7042;3=#7042,9=#13") == (((3, 7042),), ((3, 7042), (9, 13)))
    assert parse("") == ()
    for bad, says in [("3=Paris", "token ids"), ("3=#1;x", "STEP=WORD"), (";".join(["1=#1"] * 9), "at most 8")]:
        with pytest.raises(RequestError, match=says):
            parse(bad)


def test_a_request_takes_force_as_its_last_field():
    req = GenerateRequest.parse(prompt=PROMPT, force="1=#5")
    assert req.force == ((1, 5),) and list(req.__dataclass_fields__)[-1] == "force"
    assert list(ChatRequest.__dataclass_fields__)[-1] == "force"


@pytest.fixture(scope="module")
def trunk(tiny_service):
    return tiny_service.generate(GenerateRequest(prompt=PROMPT, max_tokens=6, layers="all", k=5))


def continuation_of(service, ids: list[int], n: int, temperature: float = 0.0, seed=None) -> GenerationResult:
    """The generation of `ids` itself (every position read), straight from the engine."""
    plan = service.generator.plan(GenerateRequest(prompt=PROMPT, max_tokens=1, layers="all", k=5))
    spec = dataclasses.replace(plan.specs[0], input_ids=tuple(ids))
    out = service.engine.generate(spec, Sampling(n, temperature, seed))
    return GenerationResult.from_output(out, prompt=PROMPT, ids=ids, layers=plan.layers,
                                        decode=service.prompts.decode, text="", k=5)


def test_a_branch_keeps_its_prefix_and_continues_as_its_prefix_would(tiny_service, trunk):
    ids = tiny_service.prompts.ids(PROMPT)
    forced = next(t for t in (11, 12, 13) if t != trunk.token_ids[2])
    branch = tiny_service.generate(GenerateRequest(prompt=PROMPT, max_tokens=6, layers="all", k=5,
                                                   force=f"2=#{forced}"))
    assert branch.token_ids[:2] == trunk.token_ids[:2] and branch.token_ids[2] == forced
    assert branch.forced == [(2, forced)] and len(branch.steps) == len(branch.token_ids)
    direct = continuation_of(tiny_service, ids + trunk.token_ids[:2] + [forced], 3)
    assert branch.token_ids[3:] == direct.token_ids
    # the prefix's readouts are the parent's; the forced position's, the direct generation's last prompt position
    for s in range(3):
        np.testing.assert_array_equal(branch.steps[s].readout.lenses["logit"].top_ids,
                                      trunk.steps[s].readout.lenses["logit"].top_ids)
    got, want = branch.steps[3].readout.lenses["logit"], direct.steps[0].readout.lenses["logit"]
    np.testing.assert_array_equal(got.top_ids[:, 0], want.top_ids[:, -1])
    np.testing.assert_allclose(got.top_probs[:, 0], want.top_probs[:, -1], rtol=1e-4, atol=1e-6)
    assert branch.steps[3].readout.input_tokens == [branch.tokens[2]]
    # the forced step's strip is about the forced token now; the JSON says what was forced
    assert branch.steps[2].readout.lenses["logit"].decided_ids[-1] == forced
    assert branch.to_json()["forced"] == [{"step": 2, "token_id": forced, "token": branch.tokens[2]}]
    assert parting(trunk, branch) == 2 and changed_layers(trunk, branch)[0]["step"] == 2


def test_a_branch_of_a_branch_grows_from_the_branch(tiny_service, trunk):
    one = tiny_service.generate(GenerateRequest(prompt=PROMPT, max_tokens=6, force="1=#11"))
    two = tiny_service.generate(GenerateRequest(prompt=PROMPT, max_tokens=6, force=["1=#11", "3=#12"]))
    assert two.token_ids[:3] == one.token_ids[:3] and two.token_ids[3] == 12
    assert two.forced == [(1, 11), (3, 12)]
    ids = tiny_service.prompts.ids(PROMPT)
    assert two.token_ids[4:] == continuation_of(tiny_service, ids + one.token_ids[:3] + [12], 2).token_ids
    last = tiny_service.generate(GenerateRequest(prompt=PROMPT, max_tokens=6, force="5=#13"))
    assert last.token_ids == trunk.token_ids[:5] + [13]                      # the last step: nothing follows


def test_a_sampled_branch_keeps_its_seed(tiny_service):
    req = GenerateRequest(prompt=PROMPT, max_tokens=5, temperature=1.0, seed=3)
    trunk = tiny_service.generate(req)
    branch = tiny_service.generate(dataclasses.replace(req, force=((1, 17),)))
    ids = tiny_service.prompts.ids(PROMPT)
    direct = continuation_of(tiny_service, ids + trunk.token_ids[:1] + [17], 3, temperature=1.0, seed=3)
    assert branch.token_ids == trunk.token_ids[:1] + [17] + direct.token_ids


def test_what_cannot_be_forced_says_so(tiny_service):
    for req, says in [(GenerateRequest(prompt=PROMPT, max_tokens=4, temperature=1.0, force="1=#5"), "needs a seed"),
                      (GenerateRequest(prompt=PROMPT, max_tokens=4, force="4=#5"), "past the 4 tokens"),
                      (GenerateRequest(prompt=PROMPT, max_tokens=4, force="1=#99999999"), "outside this model's")]:
        with pytest.raises(RequestError, match=says):
            tiny_service.check(req)
    assert tiny_service.check(GenerateRequest(prompt=PROMPT, max_tokens=4, force="1= Paris")).forwards == 2


def test_a_word_is_forced_as_the_model_would_write_it_there(tiny_service):
    """A word is read as targets are (prompts.py: `word`): 'patience' (two tokens on its own, 'pat' 'ience') is the
    one token ' patience' after the prompt; a word of several tokens puts its first; #ID and a typed space as ever.
    The reference is the tokenizer: the tokens the prompt's text with the word has after the prompt's own."""
    tok = tiny_service.prompts.tokenizer

    def writes(word: str) -> list[int]:
        return tok(PROMPT + " " + word)["input_ids"][len(tok(PROMPT)["input_ids"]):]

    assert len(tok("patience", add_special_tokens=False)["input_ids"]) == 2 and len(writes("patience")) == 1
    assert len(writes("Parisiennes")) > 1
    for force, want in [("0=patience", writes("patience")[0]), ("0= patience", writes("patience")[0]),
                        ("0=Parisiennes", writes("Parisiennes")[0]), ("0=#9369", 9369)]:
        branch = tiny_service.generate(GenerateRequest(prompt=PROMPT, max_tokens=3, force=force))
        assert branch.forced == [(0, want)] and branch.token_ids[0] == want, force


@pytest.mark.parametrize("k", [1, 3])
def test_a_branch_keeps_every_decision_rule_whatever_k(tiny_service, k):
    """The forced step's strip is decided again from its top five as the worker read them (results/branching.py),
    so a branch made with k < 5 keeps the top-5 rule, and its decisions are the k = 5 branch's."""
    req = GenerateRequest(prompt=PROMPT, max_tokens=4, layers="all", k=k, force="1=#11")
    wide = tiny_service.generate(dataclasses.replace(req, k=5)).decided_json()
    narrow = tiny_service.generate(req).decided_json()
    assert set(narrow) == {"decided_at", "decided_at_top5", "decided_at_p50"}
    assert narrow == wide


def test_a_chat_reply_branches_too(tiny_service):
    messages = [{"role": "user", "content": "Name a colour."}]
    req = ChatRequest(messages=messages, lens="logit", layer=2, max_tokens=5, k=3)
    reply = tiny_service.chat(req)
    branch = tiny_service.chat(dataclasses.replace(req, force=((1, 21),)))
    assert branch.token_ids[:2] == reply.token_ids[:1] + [21] and branch.forced == [(1, 21)]
    assert branch.readout[:2] == reply.readout[:2] and len(branch.readout) == len(branch.token_ids)
    assert branch.to_json()["readout"][0][0]["token_id"] == reply.top_ids[0][0]

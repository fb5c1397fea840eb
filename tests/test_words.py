"""A word is read as the model would write it after the text it follows (service/prompts.py: `word`), on every
tokenizer and in every field: a lens's targets (and a comparison's, each after its own prompt), a steering or
ablation word and its from-word, a patch's targets, a components target and foil, a forced token (generate and
chat), an evaluation's words. Describe takes no word (its inspection prompt is a prompt).

The tokenizers (tests/word_tokenizers.py): a real SentencePiece model with a dummy prefix trained here (Llama 2's
and Mistral v0.x's kind: `" Paris"` starts with the lone `▁`), a Gemma-style one (no dummy prefix) and a byte-level
BPE, each on a tiny random model of its vocabulary. The reference is the tokenizer itself: the tokens that
`tokenize(context + " Paris")` has after `tokenize(context)`'s, the token the model writes there; a target's
ranks are checked against the model's own logits (plain transformers, fp32).
"""

from __future__ import annotations

import json

import pytest
import torch
from test_families import assert_ranks_match, references
from transformers import AutoModelForCausalLM, AutoTokenizer
from word_tokenizers import CONTEXT, KINDS, SENTENCES, check_faithful, model_writes, tiny_model

from lensapp import config
from lensapp.service import (
    ChatRequest,
    ComponentsRequest,
    GenerateRequest,
    InterveneRequest,
    LensRequest,
    LensService,
    RequestError,
    components,
    evaluating,
)
from lensapp.service.requests import EvaluateRequest
from lensapp.tokenizing import joined

ITALY = "The capital of Italy is"


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    """Every test here on one torch thread (conftest's `one_thread`)."""


@pytest.fixture(scope="module", params=KINDS)
def kind(request, tmp_path_factory, embedded_dir):
    """(kind, folder, its tokenizer, the service on it: transformers backend, no lens, no cache)."""
    folder = tiny_model(request.param, tmp_path_factory.mktemp(request.param), embedded_dir)
    service = LensService.start(config.Config.of(model=str(folder), backend="transformers", jlens="none",
                                              cache_entries=0))
    service.wait_ready(300)
    yield request.param, folder, AutoTokenizer.from_pretrained(folder), service
    service.close()


def test_the_tokenizers_are_what_they_stand_for(kind):
    """The SentencePiece-made tokenizers split text as their SentencePiece model does; on the dummy-prefix one,
    `" Paris"` starts with the lone `▁` (what reading `" " + word` took for the word), and `▁Paris` is one piece."""
    name, folder, tok, _ = kind
    check_faithful(folder, SENTENCES + [" Paris", "The capital of France is ", "  two  spaces"])
    paris = model_writes(folder, CONTEXT, "Paris")
    assert len(paris) == 1 and tok.convert_ids_to_tokens(paris)[0] in ("▁Paris", "ĠParis")
    spaced = tok(" Paris", add_special_tokens=False)["input_ids"]
    assert (tok.convert_ids_to_tokens(spaced[:1]) == ["▁"]) == (name == "sentencepiece")


def test_every_field_reads_paris_as_the_model_writes_it(kind):
    _, folder, _, s = kind
    paris, rome = model_writes(folder, CONTEXT, "Paris")[0], model_writes(folder, CONTEXT, "Rome")[0]
    ids = s.prompts.ids(CONTEXT)
    assert s.prompts.word("Paris", ids).token_ids == s.prompts.word(" Paris", ids).token_ids == (paris,)
    # the lens's targets, and each compared prompt's after its own prompt
    (r,) = s.lens(LensRequest(prompts=(CONTEXT,), targets=("Paris",), k=3))
    assert r.lenses["logit"].targets[0].token_ids == [paris]
    both = s.compare(LensRequest(prompts=(CONTEXT, ITALY), targets=("Paris",), k=3))
    assert [x.lenses["logit"].targets[0].token_ids for x in both.results] == \
        [[paris], model_writes(folder, ITALY, "Paris")]
    # steering and ablation words, their from-words and the targets read with them; a patch's targets
    inputs = s.intervention_inputs()
    for kind_ in ("steer", "ablate"):
        plan = s.intervener.plan(InterveneRequest(prompt=CONTEXT, intervention=kind_, word="Paris", from_word="Rome",
                                                  layer="1", targets=("Rome",)), inputs)
        assert plan.change.word_ids == (paris, rome) and [t.token_ids[0] for t in plan.targets] == [paris, rome]
    plan = s.intervener.plan(InterveneRequest(prompt=CONTEXT, intervention="patch", source=ITALY, layer="1",
                                              targets=("Paris",)), inputs)
    assert plan.targets[0].token_ids[0] == paris
    # components: the target and the foil, after the prompt up to the position
    p = components.plan(s, ComponentsRequest(prompt=CONTEXT, target="Paris", foil="Rome"))
    assert (p.spec.target_id, p.spec.foil_id) == (paris, rome)
    p = components.plan(s, ComponentsRequest(prompt=CONTEXT, target="is", position=-2))
    assert p.spec.target_id == model_writes(folder, "The capital of France", "is")[0]
    # a forced word, in a generation and in a chat reply (after the template's text)
    gen = s.generate(GenerateRequest(prompt=CONTEXT, max_tokens=2, k=1, force=((0, "Paris"),)))
    assert gen.forced == [(0, paris)] and gen.token_ids[0] == paris
    reply = s.chat(ChatRequest(messages=({"role": "user", "content": "Where?"},), lens="logit", max_tokens=2,
                               force=((0, "Paris"),)))
    templated = s.prompts.tokenizer.apply_chat_template([{"role": "user", "content": "Where?"}],
                                                        add_generation_prompt=True, tokenize=False)
    assert reply.forced == [(0, model_writes(folder, templated, "Paris")[0])]


def test_an_evaluations_words_are_read_after_each_items_prompt(kind, tmp_path):
    _, folder, _, s = kind
    items = tmp_path / "items.json"
    items.write_text(json.dumps({"items": [{"name": "paris", "prompt": CONTEXT, "target": "Paris",
                                            "intermediates": ["Rome"]}]}))
    p = evaluating.plan(s, EvaluateRequest(items=str(items), split="all"), files=True)
    assert p.specs[0][0].target_ids == (model_writes(folder, CONTEXT, "Rome")[0], model_writes(folder, CONTEXT,
                                                                                             "Paris")[0])


def test_a_targets_ranks_are_the_models_own(kind):
    """The rank of the word the model would write, at every layer and position, from the model's own logits."""
    _, folder, _, s = kind
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    paris = model_writes(folder, CONTEXT, "Paris")[0]
    (r,) = s.lens(LensRequest(prompts=(CONTEXT,), targets=("Paris",), k=1))
    got = r.lenses["logit"].targets[0]
    for layer, logits in enumerate(references(hf, r.input_ids)):
        assert_ranks_match(got.ranks[layer], got.probs[layer], logits, paris, f"layer {layer}")


@pytest.mark.parametrize("word", ["Paris", " Paris", "Paris is", ",", "patience", "巴黎", "\n"])
@pytest.mark.parametrize("context", [CONTEXT, CONTEXT + " ", "Patience is", "法国的首都是", ""])
def test_a_word_goes_on_from_the_texts_own_tokens(kind, word, context):
    """Whatever the text ends in (a space the tokenizer merges with the word, CJK text, nothing), the word's tokens
    follow the text's own tokens and spell the text with the word joined on (`joined`: a space between words,
    none before punctuation or in CJK text, a typed space kept)."""
    _, _, tok, s = kind
    ids = s.prompts.ids(context) if context else []
    if not word.strip():
        with pytest.raises(RequestError, match="empty"):
            s.prompts.word(word, ids)
        return
    added = list(s.prompts.word(word, ids).token_ids)
    text = tok.decode(ids + added, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    before = tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    assert text == joined(before, word), (text, added)

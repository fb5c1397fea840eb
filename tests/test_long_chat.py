"""The page's chat goes on for as long as one likes (ui/chat_tab.py): it sends only the latest turns that fit (at
most MAX_CHAT_MESSAGES, the oldest turns left out as the service leaves them out: prompts.py's `recent_turns`) and
keeps only what the model read, saying when older turns were left out. And a word typed in a branch box is read as
the model would write it there, the page saying which token it put."""

from __future__ import annotations

import pytest

from lensapp import config
from lensapp.config import MAX_CHAT_MESSAGES
from lensapp.service import ChatRequest, GenerateRequest
from lensapp.service.field import RequestError
from lensapp.service.prompts import recent_turns
from lensapp.ui import branching, chat_tab


@pytest.fixture(scope="module")
def app(tiny_service):
    from lensapp import ui

    return ui.build_ui(tiny_service, config.WebSettings(), config.LimitSettings(rate_limit=0))


def conversation(n: int, system: bool = True) -> list[dict]:
    msgs = [{"role": "system", "content": "Be brief."}] if system else []
    for i in range(n):
        msgs += [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]
    return msgs + [{"role": "user", "content": "last"}]


def test_recent_turns_drop_the_oldest_whole_turns():
    msgs = conversation(100)
    kept, dropped = recent_turns(msgs, MAX_CHAT_MESSAGES)
    assert len(kept) <= MAX_CHAT_MESSAGES and dropped == len(msgs) - len(kept)
    assert kept[0] == msgs[0] and kept[1]["role"] == "user" and kept[1:] == msgs[-(len(kept) - 1):]
    assert recent_turns(msgs, 1000, drop=3) == (msgs[:1] + msgs[5:], 4)          # whole turns: 3 asked, 4 dropped
    assert recent_turns([{"role": "user", "content": "x"}], 0) == ([{"role": "user", "content": "x"}], 0)


def test_a_chat_keeps_answering_past_what_the_model_reads(app, tiny_service, monkeypatch):
    exchanges = MAX_CHAT_MESSAGES // 2 + 8          # its older turns left out for the last eight of them
    said = []
    monkeypatch.setattr(chat_tab, "warn", said.append)
    values = {**chat_tab.CHAT.initial(), "lens": "logit", "layer": None, "max_tokens": 1, "chatbot": []}
    for i in range(exchanges):
        out = chat_tab.send(chat_tab.CHAT, tiny_service, app.guard, {**values, "message": f"Question {i}?"})
        talk = chat_tab.conversation(out["chatbot"])          # the conversation lives on the page
        assert talk[-2] == {"role": "user", "content": f"Question {i}?"} and talk[-1]["role"] == "assistant"
        assert len(out["chatbot"]) == 3 * (i + 1)
        values = {**values, "chatbot": out["chatbot"]}
    assert said and "oldest messages were left out" in said[-1]
    req, _ = out["chat_last"].value           # the page sent at most what the model reads, its latest turns
    assert len(req.messages) <= MAX_CHAT_MESSAGES and req.messages[-1]["content"] == f"Question {exchanges - 1}?"


def test_the_conversation_on_the_page_is_the_text_as_written(app, tiny_service):
    """The Chatbot shows messages escaped, in Gradio's content parts; the conversation read back is as written, the
    readout (a titled message) left out, an empty reply empty."""
    typed = "Is <b>x</b> & &amp; \"y\"?"
    values = {**chat_tab.CHAT.initial(), "lens": "logit", "layer": None, "max_tokens": 1, "chatbot": []}
    out = chat_tab.send(chat_tab.CHAT, tiny_service, app.guard, {**values, "message": typed})
    as_sent = [{**m, "content": [{"type": "text", "text": m["content"]}]} for m in out["chatbot"]]   # Gradio 6
    talk = chat_tab.conversation(as_sent)
    reply = out["chat_last"].value[1]
    assert talk == [{"role": "user", "content": typed}, {"role": "assistant", "content": reply.text}]
    assert chat_tab.conversation([{"role": "assistant", "content": chat_tab.EMPTY_REPLY}]) == [
        {"role": "assistant", "content": ""}]


def test_the_api_keeps_a_long_chats_latest_turns_and_says_how_many_it_left_out(tiny_service):
    msgs = conversation(40)                              # 81 messages: the page would keep its latest turns
    reply = tiny_service.chat(ChatRequest.parse(messages=msgs, lens="logit", max_tokens=1))
    assert reply.dropped_turns >= len(msgs) - MAX_CHAT_MESSAGES
    assert reply.to_json()["dropped_turns"] == reply.dropped_turns
    with pytest.raises(RequestError, match="at most 1024 messages"):
        ChatRequest.parse(messages=conversation(600))


def test_the_page_says_which_token_a_word_put(app, tiny_service, monkeypatch):
    said = []
    monkeypatch.setattr(branching.gr, "Info", said.append)
    prompt = "The capital of France is"
    req = GenerateRequest(prompt=prompt, max_tokens=3)
    gen = tiny_service.generate(req)
    out = branching.add_branch(tiny_service, gen, req, [], branching.TRUNK, 0, "patience")
    (branch,) = out["branch_results"].value
    tok = tiny_service.prompts.tokenizer
    want = tok(prompt + " patience")["input_ids"][len(tok(prompt)["input_ids"]):]
    assert branch.forced == [(0, want[0])] and tok.convert_ids_to_tokens(want) == ["Ġpatience"]
    assert said == [f"Put ␣patience (#{want[0]}) at step 0."]
    assert branching.branch_label(gen, branch, 0).endswith(f"→ ␣patience (#{want[0]})")


def test_the_message_box_says_stop_while_the_reply_is_written_and_is_emptied_by_its_first_step(app, tiny_service,
                                                                                              monkeypatch):
    """What one types while a reply is written stays in the box (one step empties it, the first), and the box's
    button is Stop until the reply ends (a message sent meanwhile would be dropped: one submit runs at a time)."""
    values = {**chat_tab.CHAT.initial(), "lens": "logit", "layer": None, "max_tokens": 6, "chatbot": [],
              "message": "Tell me a story."}
    steps = list(chat_tab.send_streamed(chat_tab.CHAT, tiny_service, app.guard, values))
    boxes = [step["message"].constructor_args for step in steps if "message" in step]
    assert len(steps) >= 2 and len(boxes) == 2, [sorted(step) for step in steps]
    assert boxes == [{"value": "", **chat_tab.WRITING}, chat_tab.READY]
    monkeypatch.setattr(chat_tab.Pace, "charts_due", lambda self: False)      # a reply drawn only whole ...
    (whole,) = chat_tab.send_streamed(chat_tab.CHAT, tiny_service, app.guard, values)
    assert whole["message"].constructor_args == {"value": "", **chat_tab.READY}    # ... empties the box too

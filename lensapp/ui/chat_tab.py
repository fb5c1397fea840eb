"""The chat: a conversation through the chat template, each reply with a per-token lens readout.

Its settings are the `chat` request's fields but the conversation (the chat's own), the top-k (the
readout's three) and the forced tokens (the last reply's branch box sets them: ui/branching.py); it has no
link. The conversation lives on the page: it is what the Chatbot shows (its messages without a title: the
readouts and branches have one), sent with each message and read as the API reads its messages, so nothing the
server forgets can make the model answer without the context the visitor sees."""

from __future__ import annotations

import html
import operator
import time
from dataclasses import replace
from functools import partial, reduce
from typing import Iterator

import gradio as gr

from .. import charts, lens_kinds
from ..config import MAX_CHAT_MESSAGES, MAX_CHAT_SENT
from ..service.field import RequestError
from ..service.generating import Partial
from ..service.kinds import KINDS
from ..service.planning import default_chat_layer
from ..service.prompts import recent_turns
from . import branching
from .examples import CHAT_EXAMPLES
from .form import Form, asked
from .tabs import PRIVATE, Pace, how_to, new_seed, on, warn
from .views import TabView

CHAT = TabView("chat", "chat", omits=("messages", "k", "force"))

HOW_TO = """
Chat with the model through its chat template. Under every reply, each token it wrote stands over
what one lens read at one layer while it wrote it: the model's *disposition* at that depth. Hover
or tap a token for the readout's top-3. Each reply reads its lens in its own nnsight trace, step by
step as it generates, so two people reading different layers in one batch each get their own. Older
turns are dropped when the conversation outgrows the prompt limit. With a temperature above 0, the
seed makes a reply reproducible.
"""


# The message box's buttons: Send at rest, Stop while a reply is written.
READY, WRITING = {"submit_btn": True, "stop_btn": False}, {"submit_btn": False, "stop_btn": True}


def build_chat(service, guard, view: TabView = CHAT) -> dict:
    """The chat's layout and events (inside the Generation tab); its components by name."""
    has_j = service.jlens is not None
    gr.Markdown("Chat with the model; every reply shows what one layer was disposed to say at each token.")
    how_to(HOW_TO)
    form = Form(view, service)
    with gr.Row():
        lens = form.add("lens").value
        form.add("layer", gr.Dropdown, choices=service.chat_layers(lens), value=_default_layer(service, lens))
        form.add("max_tokens")
        form.add("temperature", label="Temperature")
        form.add("seed", label="Seed (empty: a fresh sample)")
        form.rest()
    parts = {**form.inputs,
             "chatbot": gr.Chatbot(label="Chat", height=420, elem_id="chat", sanitize_html=True,
                                   placeholder=f"Ask something. {'J-lens' if has_j else 'Logit-lens'} readouts "
                                               "appear under each reply.")}
    with gr.Row():
        parts["message"] = gr.Textbox(placeholder="Message", show_label=False, scale=5, elem_id="chat-message",
                                      submit_btn=True, stop_btn=False)
        clear = gr.Button("Clear", scale=1)
    gr.Examples([[m] for m in CHAT_EXAMPLES], inputs=[parts["message"]], label="Try", api_visibility="private")
    parts.update(branching.build_chat_branch())
    # the reply is written as the model writes it; the stop button ends it there, keeping what was written. While
    # a reply is written its box shows Stop in place of Send (a message sent then would be dropped: Gradio runs one
    # submit at a time); the reply's first step empties the box, so what one types meanwhile stays. Send is back
    # when the reply ends, is stopped or fails
    sent = on(parts["message"].submit, partial(send_streamed, view, service, guard), parts,
              [*form.inputs, "message", "chatbot"], ["message", "chatbot", *branching.CHAT_UPDATED], stream=True)
    sent.then(lambda: gr.Textbox(**READY), None, parts["message"], queue=False, **PRIVATE)
    parts["message"].stop(lambda: gr.Textbox(**READY), None, parts["message"], cancels=[sent], queue=False,
                          **PRIVATE)
    on(parts["lens"].input, partial(layers_for, service), parts, ["lens"], ["layer"])
    on(clear.click, forget, parts, [], ["chatbot", *branching.CHAT_UPDATED])
    _wire_branch(service, guard, parts)
    return parts


def _wire_branch(service, guard, parts: dict) -> None:
    """The last reply's branch box: a token clicked shows its alternatives; one picked (or typed) branches it."""
    on(parts["chat_branch_step"].input, branching.chat_alternatives, parts, ["chat_last", "chat_branch_step"],
       ["chat_branch_alternatives"])
    grown = ["chat_last", "chat_branch_step", "chatbot"]
    for trigger, token_from in ((parts["chat_branch_alternatives"].input, "chat_branch_alternatives"),
                                (parts["chat_branch_word"].submit, "chat_branch_word")):
        on(trigger, partial(branching.grow_chat, service, guard, readout_html, token_from), parts,
           [*grown, token_from], ["chatbot", "chat_branch_step", "chat_branch_alternatives"])


def send(view: TabView, service, guard, values: dict, request: gr.Request = None) -> dict:
    """The model's reply to the message, with its readout (a blank message: nothing), through the guard: the page
    as `send_streamed` leaves it."""
    return reduce(operator.or_, send_streamed(view, service, guard, values, request), {})


def send_streamed(view: TabView, service, guard, values: dict, request: gr.Request = None) -> Iterator[dict]:
    """`send`, written as the model writes (what the page's Send does)."""
    text = values["message"]
    if text is None or isinstance(text, str) and not text.strip():
        return iter([{}])
    return guard.ui_stream(request, reply_to, view, service, values)


def reply_to(view: TabView, service, values: dict) -> Iterator[dict]:
    """The reply to the conversation on the page and the new message. The page sends what the chat can read: at
    most MAX_CHAT_MESSAGES messages (the oldest turns left out, as the service leaves them out: it drops more to fit
    the prompt limit), so a chat goes on for as long as one likes, about its latest turns. A sample gets a seed,
    so the reply can be made again (ui/kept.py)."""
    text = values["message"]
    shown = values["chatbot"] or []
    history, cut = recent_turns(conversation(shown), MAX_CHAT_MESSAGES - 1)
    messages = history + [{"role": "user", "content": text}]
    req = asked(view, service, values, messages=messages)
    if req.seed is None and req.sampled:
        req = replace(req, seed=new_seed())
    pace, reply, emptied = Pace(), None, False               # the box is emptied once, by the first step
    for item in KINDS[view.kind].stream(service, req):
        if not isinstance(item, Partial):
            reply = item
        elif pace.charts_due():
            # the reply so far, and no branch box: one on a reply still being written would branch the last one
            started = time.monotonic()
            box = {} if emptied else {"message": gr.Textbox("", **WRITING)}
            yield {**box, "chatbot": shown + turn(text, item.so_far(), req), **branching.chat_steps(None)}
            pace.drawn(started)
            emptied = True
    if cut + reply.dropped_turns:
        warn(f"The conversation outgrew what the model reads at once; the {cut + reply.dropped_turns} oldest "
             "messages were left out.")
    box = gr.Textbox(**READY) if emptied else gr.Textbox("", **READY)
    yield {"message": box, "chatbot": shown + turn(text, reply, req), **branching.chat_steps((req, reply))}


def turn(text: str, reply, req) -> list[dict]:
    """The Chatbot's messages for one turn: the visitor's, the reply, and the reply's readout (titled)."""
    lens_name = lens_kinds.lens(req.lens).label
    return [{"role": "user", "content": _escape(text)},
            {"role": "assistant", "content": _escape(reply.text) or EMPTY_REPLY},
            {"role": "assistant", "content": readout_html(reply),
             "metadata": {"title": f"{lens_name} at layer {reply.layer}: its top-1 under each token "
                                   "(hover or tap a token for the top-3)"}}]


EMPTY_REPLY = "(empty reply)"


def conversation(shown: list) -> list[dict]:
    """The conversation a Chatbot's value shows: its messages without a title (a readout or a branch has one), as
    written (they are shown escaped); the request reads them as the API's messages (each checked, one line if one
    is not a message)."""
    if not isinstance(shown, list):
        raise RequestError("the chat's conversation must be a list of messages")
    out = []
    for message in shown[-MAX_CHAT_SENT:]:
        titled = isinstance(message, dict) and isinstance(message.get("metadata"), dict) and message["metadata"].get(
            "title")
        if not isinstance(message, dict) or titled:
            continue
        text = html.unescape(_text_of(message.get("content")))
        role = message.get("role")
        out.append({"role": role, "content": "" if role == "assistant" and text == EMPTY_REPLY else text})
    return out


def _text_of(content) -> str:
    """A Chatbot message's text: a string, or its text parts (Gradio 6 sends [{"type": "text", "text": ...}])."""
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        return "".join(str(part.get("text", "")) for part in content
                       if isinstance(part, dict) and part.get("type") == "text")
    return ""


def layers_for(service, values: dict, request: gr.Request = None) -> dict:
    """The readout layers of the chosen lens, its default chosen."""
    lens = values["lens"]
    return {"layer": gr.Dropdown(choices=service.chat_layers(lens), value=_default_layer(service, lens))}


def forget(values: dict, request: gr.Request = None) -> dict:
    return {"chatbot": [], **branching.chat_steps(None)}


def readout_html(reply) -> str:
    """Each generated token over the readout's top-1; hover (title) or tap (details) shows the top-k.

    Every piece of model text is escaped here and shown through `show_token`, so it is text, never
    markup; the only tags are the ones written below.
    """
    cells = []
    for tok, top in zip(reply.tokens, reply.readout):
        first, p = top[0] if top else ("", 0.0)
        listing = " · ".join(f"{charts.show_token(t)} {100 * q:.0f}%" for t, q in top)
        cells.append(
            f'<details class="lens-tok" title="{html.escape(listing)}"><summary>'
            f'<span class="gen">{html.escape(charts.show_token(tok))}</span>'
            f'<span class="top1">{html.escape(charts.show_token(first))} {100 * p:.0f}%</span></summary>'
            f'<span class="topk">{html.escape(listing)}</span></details>')
    return '<div class="lens-readout">' + "".join(cells) + "</div>"


def _escape(text: str) -> str:
    return html.escape(text, quote=False)


def _default_layer(service, lens: str) -> int:
    return default_chat_layer(service.chat_layers(lens), service.info.n_layers)

"""The chat: a conversation through the chat template, each reply with a per-token lens readout."""

from __future__ import annotations

import html

import gradio as gr

from .. import charts
from ..config import MAX_GENERATE_TOKENS, MAX_SEED, MAX_TEMPERATURE
from ..service import ChatRequest
from ..service import fields as f
from ..service.planning import default_chat_layer
from . import branching
from .examples import CHAT_EXAMPLES
from .tabs import PRIVATE, warn

HOW_TO = """
Chat with the model through its chat template. Under every reply, each token it wrote stands over
what one lens read at one layer while it wrote it: the model's *disposition* at that depth. Hover
or tap a token for the readout's top-3. The readout is installed in the engine once (nnsight
`model.edit()` on vLLM) and rides every chat request, so each turn pays only its own readout. Older
turns are dropped when the conversation outgrows the prompt limit. With a temperature above 0, the
seed makes a reply reproducible.
"""


def build_chat(service, guard) -> dict:
    has_j = service.jlens is not None
    lens_default = "jacobian" if has_j else "logit"
    gr.Markdown("Chat with the model; every reply shows what one layer was disposed to say at each token.")
    with gr.Accordion("How to read this", open=False):
        gr.Markdown(HOW_TO)
    with gr.Row():
        choices = [("Jacobian lens", "jacobian"), ("logit lens", "logit")] if has_j else [("logit lens", "logit")]
        chat_lens = gr.Radio(choices, value=lens_default, label="Readout lens", elem_id="chat-lens")
        layer = gr.Dropdown(choices=service.chat_layers(lens_default), value=_default_layer(service, lens_default),
                            label="Readout layer", elem_id="chat-layer")
        max_tokens = gr.Slider(1, MAX_GENERATE_TOKENS, value=f.CHAT_MAX_TOKENS.default, step=1, label="Max new tokens")
        temperature = gr.Slider(0.0, MAX_TEMPERATURE, value=f.TEMPERATURE.default, step=0.05, label="Temperature")
        seed = gr.Number(label="Seed (empty: a fresh sample)", value=f.SEED.default, minimum=0, maximum=MAX_SEED,
                         precision=0, elem_id="chat-seed")
    chatbot = gr.Chatbot(label="Chat", height=420, elem_id="chat", sanitize_html=True,
                         placeholder=f"Ask something. {'J-lens' if has_j else 'Logit-lens'} readouts appear under "
                                     "each reply.")
    with gr.Row():
        message = gr.Textbox(placeholder="Message", show_label=False, scale=5, elem_id="chat-message",
                             submit_btn=True)
        clear = gr.Button("Clear", scale=1)
    gr.Examples([[m] for m in CHAT_EXAMPLES], inputs=[message], label="Try", api_visibility="private")
    history = gr.State([])           # the real conversation; the Chatbot shows an escaped copy plus readouts
    branch = branching.build_chat_branch()

    def reply_to(text, history, shown, layer, lens, max_tokens, temperature, seed):
        messages = history + [{"role": "user", "content": text}]
        req = ChatRequest.parse(messages=messages, layer=layer, lens=lens, max_tokens=max_tokens,
                                temperature=temperature, seed=seed)
        reply = service.chat(req)
        if reply.dropped_turns:
            warn(f"The conversation outgrew the prompt limit; the {reply.dropped_turns} oldest messages were left out.")
        lens_name = "J-lens" if lens == "jacobian" else "logit lens"
        shown = shown + [
            {"role": "user", "content": _escape(text)},
            {"role": "assistant", "content": _escape(reply.text) or "(empty reply)"},
            {"role": "assistant", "content": readout_html(reply),
             "metadata": {"title": f"{lens_name} at layer {reply.layer}: its top-1 under each token "
                                   "(hover or tap a token for the top-3)"}},
        ]
        return ("", messages + [{"role": "assistant", "content": reply.text}], shown, (req, reply),
                *branching.chat_steps((req, reply)))

    def send(text, history, shown, layer, lens, max_tokens, temperature, seed, request: gr.Request = None):
        if text is None or isinstance(text, str) and not text.strip():
            return (gr.skip(),) * 6
        return guard.ui(request, reply_to, text, history, shown, layer, lens, max_tokens, temperature, seed)

    def grow(last, step, token, shown, request: gr.Request = None):
        return guard.ui(request, branching.chat_branch, service, last, step, token, shown, readout_html)

    def on_lens(lens):
        return gr.Dropdown(choices=service.chat_layers(lens), value=_default_layer(service, lens))

    message.submit(send, [message, history, chatbot, layer, chat_lens, max_tokens, temperature, seed],
                   [message, history, chatbot, branch["last"], branch["step"], branch["alternatives"]], **PRIVATE)
    branch["step"].input(branching.chat_alternatives, [branch["last"], branch["step"]], branch["alternatives"],
                         **PRIVATE)
    branch["alternatives"].input(grow, [branch["last"], branch["step"], branch["alternatives"], chatbot],
                                 [chatbot, branch["step"], branch["alternatives"]], **PRIVATE)
    branch["word"].submit(grow, [branch["last"], branch["step"], branch["word"], chatbot],
                          [chatbot, branch["step"], branch["alternatives"]], **PRIVATE)
    chat_lens.input(on_lens, chat_lens, layer, **PRIVATE)
    clear.click(lambda: ([], [], None, gr.Radio(choices=[], value=None)), None,
                [history, chatbot, branch["last"], branch["step"]], **PRIVATE)
    return {"send": send, "chat_branch": grow}


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

"""The generation tab: a readout of the newest token at every step, and a chat with a live lens readout."""

from __future__ import annotations

import html
import json

import gradio as gr
import pandas as pd

from .. import charts
from ..config import MAX_GENERATE_TOKENS, MAX_K
from ..engine import GenerateRequest
from .examples import CHAT_EXAMPLES, generate_examples
from .permalinks import View
from .tab import PRIVATE, Exports, TabParts, call_engine, int_or, to_int, warn

HOW_TO = """
The model writes one token per **step**. Each **column** is a step, labelled by the token the model
produced there; each **row** a layer (0 at the bottom). A cell is the lens's top-1 at the newest position
of that step, the position whose output *is* that column's token. So a cell equal to its column label
means that layer already said what the model went on to say; the top row always does under greedy
decoding (temperature 0).

Step 0 reads the last prompt token. Pick a step below for its top-k at every layer.
"""

CHAT_HOW_TO = """
Chat with the model through its chat template. Every reply carries, for each token it wrote, the
top-3 of one lens at one layer: the model's *disposition* at that depth while it wrote the token.
The readout is installed in the engine once (nnsight `model.edit()` on vLLM) and rides every chat
request, so each turn pays only its own readout. Older turns are dropped when the conversation
outgrows the prompt limit.
"""


def build_generate_tab(engine, cfg, exports: Exports) -> TabParts:
    d = View()
    n = engine.info.n_layers
    has_j = engine.jlens is not None
    lens_choices = [("logit lens", "logit")] + ([("Jacobian lens", "jacobian"), ("both", "both")] if has_j else [])
    with gr.Tab("Generation", id="generate"):
        with gr.Tabs():
            with gr.Tab("Step by step", id="generate-steps"):
                gr.Markdown("Generate, and read every layer at the newest token of every step.")
                with gr.Accordion("How to read this", open=False):
                    gr.Markdown(HOW_TO)
                prompt = gr.Textbox(label="Prompt", value=d.prompt, lines=2, max_lines=8, elem_id="generate-prompt")
                with gr.Row():
                    max_tokens = gr.Slider(1, MAX_GENERATE_TOKENS, value=d.max_tokens, step=1, label="Max new tokens",
                                           elem_id="generate-max-tokens")
                    temperature = gr.Slider(0.0, 2.0, value=d.temperature, step=0.05, label="Temperature (0 = greedy)",
                                            elem_id="generate-temperature")
                    lens = gr.Radio(lens_choices, value=d.lens, label="Lens", elem_id="generate-lens")
                with gr.Row():
                    layers = gr.Textbox(label=f"Layers (all, 10-20 or 0,5,-1; this model: 0..{n - 1})", value=d.layers,
                                        elem_id="generate-layers")
                    k = gr.Number(label="Top-k", value=d.k, minimum=1, maximum=MAX_K, precision=0, elem_id="generate-k")
                    chat = gr.Checkbox(label="Wrap in the chat template (instruct models)", value=d.chat)
                run_button = gr.Button("Generate", variant="primary", elem_id="generate-run")
                examples = generate_examples(prompt)
                text = gr.Textbox(label="Generated text", interactive=False, elem_id="generate-text")
                heatmap = gr.Plot(label="Layers × generation steps", elem_id="generate-heatmap",
                                  elem_classes=["lens-plot"], show_label=False)
                with gr.Row():
                    step = gr.Dropdown(label="Token table: step", choices=[], interactive=True, elem_id="generate-step")
                    table_lens = gr.Radio(lens_choices[:2], value="logit", label="Table lens", visible=has_j)
                table = gr.Dataframe(label="Top-k at this step's newest token, every layer", interactive=False,
                                     wrap=True,
                                     elem_id="generate-table")
                with gr.Row():
                    csv_file = gr.DownloadButton("Download CSV", visible=False, size="sm")
                    json_file = gr.DownloadButton("Download JSON", visible=False, size="sm")
                state = gr.State()
            with gr.Tab("Chat", id="generate-chat"):
                _build_chat(engine, has_j)

    def run(prompt, max_tokens, temperature, lens, layers, k, chat):
        if lens not in ("logit", "jacobian", "both") or (lens != "logit" and not has_j):
            warn("No Jacobian lens is loaded; using the logit lens.")
            lens = "logit"
        req = GenerateRequest(prompt=prompt, max_tokens=to_int(max_tokens, "max tokens"), lens=lens,
                              layers=(layers or "all").strip(), k=to_int(k, "k"), temperature=float(temperature or 0),
                              chat=bool(chat))
        gen = call_engine(engine.generate, req)
        shown = "jacobian" if lens == "both" else lens
        last = len(gen.steps) - 1
        return (
            gen,
            gen.text,
            charts.generation_heatmap(gen, lens),
            gr.Dropdown(choices=step_choices(gen), value=last),
            gr.Radio(value=shown),
            step_table(gen, last, shown),
            gr.DownloadButton(value=exports.write("generation", ".csv", generation_csv(gen)), visible=True),
            gr.DownloadButton(value=exports.write("generation", ".json", json.dumps(gen.to_json(), ensure_ascii=False)),
                              visible=True),
        )

    outputs = [state, text, heatmap, step, table_lens, table, csv_file, json_file]
    inputs = [prompt, max_tokens, temperature, lens, layers, k, chat]
    run_button.click(run, inputs, outputs, **PRIVATE)
    prompt.submit(run, inputs, outputs, **PRIVATE)
    examples.load_input_event.then(run, inputs, outputs, **PRIVATE)
    def show_step(gen, s, lens):
        return gr.skip() if gen is None or s is None else step_table(gen, int(s), lens)

    gr.on([step.input, table_lens.input], show_step, [state, step, table_lens], table, **PRIVATE)

    def to_view(prompt, max_tokens, temperature, lens, layers, k, chat) -> View:
        return View(tab="generate", prompt=prompt or "", max_tokens=int_or(max_tokens, d.max_tokens),
                    temperature=float(temperature or 0), lens=lens or "logit", layers=layers or "all",
                    k=int_or(k, d.k), chat=bool(chat))

    fields = {"prompt": prompt, "max_tokens": max_tokens, "temperature": temperature, "lens": lens,
              "layers": layers, "k": k, "chat": chat}
    return TabParts("generate", fields, to_view, run, inputs, outputs, run_button, examples)


def step_choices(gen) -> list[tuple[str, int]]:
    return [(f"step {s}: {charts.clip(charts.show_token(st.token), 20)}", s) for s, st in enumerate(gen.steps)]


def step_table(gen, s: int, lens: str) -> pd.DataFrame:
    readout = gen.steps[s].readout
    if lens not in readout.lenses:
        lens = next(iter(readout.lenses))
    return charts.display_tokens(readout.top_k_table(lens, -1))


def generation_csv(gen) -> str:
    """One row per step x lens x layer x position x rank (step 0 covers every prompt position)."""
    frames = [s.readout.long_frame().assign(step=i, generated_token=s.token) for i, s in enumerate(gen.steps)]
    df = pd.concat(frames, ignore_index=True)
    return df[["step", "generated_token"] + [c for c in df.columns if c not in ("step", "generated_token")]].to_csv(
        index=False)


# -- chat ----------------------------------------------------------------------------------------

def _build_chat(engine, has_j: bool) -> None:
    lens_default = "jacobian" if has_j else "logit"
    gr.Markdown("Chat with the model; every reply shows what one layer was disposed to say at each token.")
    with gr.Accordion("How to read this", open=False):
        gr.Markdown(CHAT_HOW_TO)
    with gr.Row():
        choices = [("Jacobian lens", "jacobian"), ("logit lens", "logit")] if has_j else [("logit lens", "logit")]
        chat_lens = gr.Radio(choices, value=lens_default, label="Readout lens", elem_id="chat-lens")
        layer = gr.Dropdown(choices=_layer_choices(engine, lens_default), value=_default_layer(engine, lens_default),
                            label="Readout layer", elem_id="chat-layer")
        max_tokens = gr.Slider(1, MAX_GENERATE_TOKENS, value=32, step=1, label="Max new tokens")
        temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="Temperature")
    chatbot = gr.Chatbot(label="Chat", height=420, elem_id="chat", sanitize_html=True,
                         placeholder=f"Ask something. {'J-lens' if has_j else 'Logit-lens'} readouts appear under "
                                     "each reply.")
    with gr.Row():
        message = gr.Textbox(placeholder="Message", show_label=False, scale=5, elem_id="chat-message",
                             submit_btn=True)
        clear = gr.Button("Clear", scale=1)
    gr.Examples([[m] for m in CHAT_EXAMPLES], inputs=[message], label="Try", api_visibility="private")
    history = gr.State([])           # the real conversation; the Chatbot shows an escaped copy plus readouts

    def send(text, history, shown, layer, lens, max_tokens, temperature):
        if not (text or "").strip():
            return gr.skip(), gr.skip(), gr.skip()
        messages = history + [{"role": "user", "content": text}]
        reply = call_engine(engine.chat, messages, layer=int(layer), lens=lens, max_tokens=int(max_tokens),
                            temperature=float(temperature))
        if reply.dropped_turns:
            warn(f"The conversation outgrew the prompt limit; the {reply.dropped_turns} oldest messages were left out.")
        lens_name = "J-lens" if lens == "jacobian" else "logit lens"
        shown = shown + [
            {"role": "user", "content": _escape(text)},
            {"role": "assistant", "content": _escape(reply.text) or "(empty reply)"},
            {"role": "assistant", "content": readout_block(reply),
             "metadata": {"title": f"{lens_name} at layer {reply.layer}: top-3 at each generated token"}},
        ]
        return "", messages + [{"role": "assistant", "content": reply.text}], shown

    def on_lens(lens):
        return gr.Dropdown(choices=_layer_choices(engine, lens), value=_default_layer(engine, lens))

    message.submit(send, [message, history, chatbot, layer, chat_lens, max_tokens, temperature],
                   [message, history, chatbot], **PRIVATE)
    chat_lens.input(on_lens, chat_lens, layer, **PRIVATE)
    clear.click(lambda: ([], []), None, [history, chatbot], **PRIVATE)


def readout_block(reply) -> str:
    """Per generated token, the readout's top-k, as a fenced block (shown literally, never as markup)."""
    rows = [(charts.show_token(tok), "   ".join(f"{charts.show_token(t)} {100 * p:.0f}%" for t, p in top))
            for tok, top in zip(reply.tokens, reply.readout)]
    width = max((len(r[0]) for r in rows), default=5)
    body = "\n".join(f"{tok.ljust(width)}  →  {top}" for tok, top in rows)
    return f"~~~~text\n{body}\n~~~~"          # every body line has an arrow, so none can close the fence


def _escape(text: str) -> str:
    return html.escape(text, quote=False)


def _layer_choices(engine, lens: str) -> list[int]:
    return list(engine.jlens_layers) if lens == "jacobian" else list(range(engine.info.n_layers))


def _default_layer(engine, lens: str) -> int:
    pool = _layer_choices(engine, lens)
    return min(pool, key=lambda x: abs(x - 2 * (engine.info.n_layers - 1) / 3))

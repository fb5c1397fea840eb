"""The generation tab: a readout of the newest token at every step, and the chat (chat_tab.py)."""

from __future__ import annotations

from dataclasses import replace

import gradio as gr
import pandas as pd

from .. import charts
from ..config import LENS_CHOICES, MAX_GENERATE_TOKENS, MAX_K, MAX_SEED, MAX_TEMPERATURE
from ..service import GenerateRequest
from . import branching
from .chat_tab import build_chat
from .decisions import build_strip, draw_strip
from .downloads import Downloads
from .examples import generate_examples
from .permalinks import View, view_of
from .tabs import PRIVATE, TabParts, build_chart, int_or, lens_choices, new_seed, warn

HOW_TO = """
The model writes one token per **step**. Each **column** is a step, labelled by the token the model
produced there; each **row** a layer (0 at the bottom). A cell is the lens's top-1 at the newest position
of that step, the position whose output *is* that column's token. So a cell equal to its column label
means that layer already said what the model went on to say; the top row always does under greedy
decoding (temperature 0).

Step 0 reads the last prompt token. Pick a step below for its top-k at every layer. With a temperature
above 0, the seed makes the sample reproducible: left empty, a run picks one and shows it.
"""


def build_generate_tab(service, guard, downloads: Downloads) -> TabParts:
    d = View()
    n = service.info.n_layers
    choices = lens_choices(service)
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
                    temperature = gr.Slider(0.0, MAX_TEMPERATURE, value=d.temperature, step=0.05,
                                            label="Temperature (0 = greedy)", elem_id="generate-temperature")
                    lens = gr.Radio(choices, value=d.lens, label="Lens", elem_id="generate-lens")
                with gr.Row():
                    layers = gr.Textbox(label=f"Layers (all, 10-20 or 0,5,-1; this model: 0..{n - 1})", value=d.layers,
                                        elem_id="generate-layers")
                    k = gr.Number(label="Top-k", value=d.k, minimum=1, maximum=MAX_K, precision=0, elem_id="generate-k")
                    seed = gr.Number(label="Seed (sampling: the same seed gives the same text)", value=d.seed,
                                     minimum=0, maximum=MAX_SEED, precision=0, elem_id="generate-seed")
                    reseed = gr.Button("New seed", size="sm", scale=0, min_width=100, elem_id="generate-new-seed")
                with gr.Row():
                    chat = gr.Checkbox(label="Wrap in the chat template (instruct models)", value=d.chat)
                    raw = gr.Checkbox(label="Raw logits", value=d.raw, elem_id="generate-raw",
                                      info="h·W_U alone, without the model's own logit soft-capping or scaling")
                run_button = gr.Button("Generate", variant="primary", elem_id="generate-run", elem_classes=["run"])
                examples = generate_examples(prompt)
                text = gr.Textbox(label="Generated text", interactive=False, elem_id="generate-text")
                heatmap = gr.Plot(elem_id="generate-heatmap", elem_classes=["lens-plot"], show_label=False)
                strip = build_strip("generate")
                with gr.Row():
                    step = gr.Dropdown(label="Token table: step", choices=[], interactive=True, elem_id="generate-step")
                    table_lens = gr.Radio(choices[:2], value="logit", label="Table lens", visible=len(choices) > 1)
                table = gr.Dataframe(label="Top-k at this step's newest token, every layer", interactive=False,
                                     wrap=True, elem_id="generate-table")
                state = gr.State()
                csv_file, json_file = downloads.buttons("generation", state)
                branch = branching.build_branch_panel(n)
                req_state = gr.State()          # the request the generation on the page answered (its branches')
            with gr.Tab("Chat", id="generate-chat"):
                chat_handlers = build_chat(service, guard)

    def readout(prompt, max_tokens, temperature, lens, layers, k, chat, seed, raw, branches="", rule="top1"):
        if isinstance(lens, str) and lens in LENS_CHOICES and lens not in {value for _, value in choices}:
            warn("No Jacobian lens is loaded; using the logit lens.")
            lens = "logit"
        req = GenerateRequest.parse(prompt=prompt, max_tokens=max_tokens, lens=lens, layers=layers, k=k,
                                    temperature=temperature, seed=seed, chat=chat, raw=raw)
        if req.seed is None and req.sampled:                          # a sample that can be had again
            req = replace(req, seed=new_seed())
        gen = service.generate(req)
        results = branching.compute_branches(service, req, branches)
        shown = "jacobian" if lens == "both" else lens
        last = len(gen.steps) - 1
        return (
            gen,
            req.seed,
            gen.text,
            build_chart(charts.generation_heatmap, gen, lens),
            gr.Dropdown(choices=step_choices(gen), value=last),
            gr.Radio(value=shown),
            step_table(gen, last, shown),
            gr.Button(visible=True),                 # the downloads: built from `gen` when asked for
            gr.Button(visible=True),
            req,
            *draw_strip(gen, rule),
            *branching.panel_updates(gen, results, rule=rule),
        )

    def run(prompt, max_tokens, temperature, lens, layers, k, chat, seed, raw, branches="", rule="top1",
            request: gr.Request = None):
        """The readout of the inputs, with the branches a link names (the page's own Generate starts afresh)."""
        return guard.ui(request, readout, prompt, max_tokens, temperature, lens, layers, k, chat, seed, raw, branches,
                        rule)

    def run_fresh(prompt, max_tokens, temperature, lens, layers, k, chat, seed, raw, branches="", rule="top1",
                  request: gr.Request = None):
        return run(prompt, max_tokens, temperature, lens, layers, k, chat, seed, raw, "", rule, request=request)

    outputs = ([state, seed, text, heatmap, step, table_lens, table, csv_file, json_file, req_state,
                strip["strip"], strip["summary"]] + [branch[name] for name in branching.UPDATED])
    inputs = [prompt, max_tokens, temperature, lens, layers, k, chat, seed, raw, branch["branches"], strip["rule"]]
    reseed.click(new_seed, None, seed, queue=False, **PRIVATE)
    run_button.click(run_fresh, inputs, outputs, **PRIVATE)
    prompt.submit(run_fresh, inputs, outputs, **PRIVATE)
    examples.load_input_event.then(run_fresh, inputs, outputs, **PRIVATE)
    strip["rule"].input(draw_strip, [state, strip["rule"]], [strip["strip"], strip["summary"]], **PRIVATE)
    grow = wire_branches(service, guard, branch, state, req_state, strip["rule"])

    def show_step(gen, s, lens):
        s = int_or(s, -1)
        if gen is None or not 0 <= s < len(gen.steps):       # none chosen, or not one of the choices
            return gr.skip()
        return step_table(gen, s, lens)

    def pick_step(gen, s, lens, request: gr.Request = None):
        return guard.ui(request, show_step, gen, s, lens)

    gr.on([step.input, table_lens.input], pick_step, [state, step, table_lens], table, **PRIVATE)

    fields = {"prompt": prompt, "max_tokens": max_tokens, "temperature": temperature, "lens": lens,
              "layers": layers, "k": k, "chat": chat, "seed": seed, "raw": raw, "branches": branch["branches"]}
    return TabParts("generate", fields, lambda *values: view_of("generate", **dict(zip(fields, values))), run,
                    inputs, outputs, run_button, handlers={"show_step": pick_step, "chat_send": chat_handlers["send"],
                                                           "grow_branch": grow,
                                                           "chat_branch": chat_handlers["chat_branch"]})


def wire_branches(service, guard, b: dict, state, req_state, rule):
    """The branch panel's events (ui/branching.py): a token clicked shows its alternatives; one picked (or typed)
    grows a branch; another branch chosen is shown beside the generation. Returns the handler that grows one."""
    updated = [b[name] for name in branching.UPDATED]

    def grow(gen, req, results, source, step, token, rule, request: gr.Request = None):
        return guard.ui(request, branching.add_branch, service, gen, req, results, source, step, token, rule)

    b["source"].input(branching.pick_source, [state, b["results"], b["source"]], [b["step"], b["alternatives"]],
                      **PRIVATE)
    gr.on([b["step"].input, b["layer"].input], branching.alternatives_at,
          [state, b["results"], b["source"], b["step"], b["layer"]], b["alternatives"], **PRIVATE)
    b["alternatives"].input(grow, [state, req_state, b["results"], b["source"], b["step"], b["alternatives"], rule],
                            updated, **PRIVATE)
    gr.on([b["force"].click, b["word"].submit], grow,
          [state, req_state, b["results"], b["source"], b["step"], b["word"], rule], updated, **PRIVATE)
    b["shown"].input(branching.show, [state, b["results"], b["shown"], rule], [b["heatmap"], b["strip"],
                                                                             b["divergence"]], **PRIVATE)
    return grow


def step_choices(gen) -> list[tuple[str, int]]:
    return [(f"step {s}: {charts.clip(charts.show_token(st.token), 20)}", s) for s, st in enumerate(gen.steps)]


def step_table(gen, s: int, lens: str) -> pd.DataFrame:
    readout = gen.steps[s].readout
    if not isinstance(lens, str) or lens not in readout.lenses:
        lens = next(iter(readout.lenses))
    return charts.display_tokens(readout.top_k_table(lens, -1))

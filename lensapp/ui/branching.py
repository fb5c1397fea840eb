"""Branch a generation at any token, in the Generate tab and the chat (service/branching.py).

Click a generated token (a step): its top-k alternatives at the output, and at the layer you are looking at,
appear; pick one (or type one token) and the generation goes on from it, with the same settings and seed,
beside the generation it came from: its text, its readout, its decision strip, and where the two part (which
layers changed their mind). A branch can branch again (choose it under *Branch from*). The link carries the
branches as their forced steps and token ids (`permalinks.BRANCHES`), so it opens on every one of them.

`build_branch_panel` makes the components, by name; the handlers below are plain functions of the service
and the page's values, wired by generate_tab.py and chat_tab.py.
"""

from __future__ import annotations

import dataclasses
import html

import gradio as gr

from .. import charts
from ..config import MAX_BRANCHES, MAX_FORCES, MAX_GENERATE_TOKENS
from ..lens_kinds import LOGIT
from ..results.branching import changed_layers, parting
from ..service import GenerateRequest, parsers
from ..service import fields as f
from ..service.field import RequestError
from .decisions import draw_strip
from .kept import Kept, kept_state, recipe
from .tabs import build_chart, md_text, warn

HOW_TO = ("Click a generated token to see what else the model could have said there, at the output and at a "
          "layer; pick one and the generation goes on from it with the same settings and seed (only the new part "
          "is computed). Branch a branch by choosing it under *Branch from*.")
TRUNK = -1                  # "Branch from" / "Show": the generation itself


def build_branch_panel(n_layers: int) -> dict[str, gr.components.Component]:
    """The panel's components, by name (the link's branches are the form's: `views.BRANCHES`)."""
    with gr.Accordion("Branch: the road not taken", open=True, elem_id="branch-box"):
        gr.Markdown(HOW_TO)
        out = {"branch_source": gr.Radio([("the generation", TRUNK)], value=TRUNK, label="Branch from",
                                         elem_id="branch-source"),
               "branch_step": gr.Radio([], label="Click a generated token", elem_id="branch-step")}
        with gr.Row():
            out["branch_layer"] = gr.Dropdown(list(range(n_layers)), value=2 * n_layers // 3,
                                              label="Alternatives at layer", elem_id="branch-layer", scale=1)
            out["branch_word"] = gr.Textbox(label="…or put this word there (as it would follow the text, or #ID)",
                                            elem_id="branch-word", scale=3)
            out["branch_force"] = gr.Button("Branch", size="sm", scale=0, min_width=90, elem_id="branch-force")
        # What has nothing to show yet is hidden until it has: the alternatives until a token is clicked, the
        # branches' list, choice and charts until a branch exists (no empty frames on a first view).
        out["branch_alternatives"] = gr.Radio([], label="Pick a token to put there", elem_id="branch-alternatives",
                                              visible=False)
        out["branch_listing"] = gr.Markdown(elem_id="branch-listing")
        out["branch_shown"] = gr.Radio([], label="Show beside the generation", elem_id="branch-shown", visible=False)
        for name in ("heatmap", "strip", "divergence"):
            out[f"branch_{name}"] = gr.Plot(elem_id=f"branch-{name}", elem_classes=["lens-plot"], show_label=False,
                                            visible=False)
        out["branch_results"] = kept_state(empty=[])
        out["req"] = kept_state()           # the request the generation on the page answered (its branches')
    return out


# What `panel_updates` fills (a generation's run writes these too).
UPDATED = ("branches", "branch_results", "branch_source", "branch_step", "branch_alternatives", "branch_listing",
           "branch_shown", "branch_heatmap", "branch_strip", "branch_divergence")
SHOWN = ("branch_heatmap", "branch_strip", "branch_divergence")


_CHAINS = parsers.branches(MAX_BRANCHES, MAX_FORCES, MAX_GENERATE_TOKENS - 1)


def chains_of(text: str) -> list[tuple]:
    """The page's branches (their link text, as `views.BRANCHES` keeps it) as force chains."""
    return list(_CHAINS(text or ""))


def compute_branches(service, req: GenerateRequest, text: str) -> list:
    """Each branch the text names, generated (its trunk and shorter branches come from the result cache); one that
    does not fit this generation (a step past its end) is left out with a warning."""
    out = []
    for chain in chains_of(text):
        try:
            out.append(service.generate(dataclasses.replace(req, force=chain)))
        except RequestError as e:
            warn(f"A branch of the link was left out: {e}")
    return out


def panel_updates(gen, results: list, show: int | None = None, rule: str = "top1", req=None) -> dict:
    """The panel for a generation and its branches (`UPDATED`, by name), showing branch `show` (the newest); the
    link's branches are theirs, as token ids. `req`: the generation's request, that the page's branches can be made
    again from it (ui/kept.py)."""
    labels = [branch_label(gen, r, i) for i, r in enumerate(results)]
    show = len(results) - 1 if show is None else show
    chains = [tuple(r.forced) for r in results]
    kept_results = results if req is None else Kept(results, recipe("generate", req, "branches", chains))
    return {"branches": parsers.branches_text(chains), "branch_results": kept_results,
            "branch_source": gr.Radio(choices=[("the generation", TRUNK)] + [(lab, i) for i, lab in enumerate(labels)],
                                      value=TRUNK),
            "branch_step": gr.Radio(choices=step_choices(gen), value=None),
            "branch_alternatives": gr.Radio(choices=[], value=None, visible=False),
            "branch_listing": listing(gen, results, labels),
            "branch_shown": gr.Radio(choices=[(lab, i) for i, lab in enumerate(labels)],
                                     value=show if results else None, visible=bool(results)),
            **drawn(gen, results, show, rule)}


def drawn(gen, results: list, show: int, rule: str = "top1") -> dict:
    """Branch `show`'s heatmap, strip and divergence beside the generation (nothing where there is none)."""
    if gen is None or not 0 <= show < len(results):
        return {name: gr.Plot(None, visible=False) for name in SHOWN}
    branch = results[show]
    lens = gen.lens_names[0]
    divergence = build_chart(charts.branch_divergence, gen, branch, lens) if parting(gen, branch) is not None else None
    return {"branch_heatmap": gr.Plot(build_chart(charts.generation_heatmap, branch, lens), visible=True),
            "branch_strip": gr.Plot(draw_strip(branch, rule)[0], visible=True),
            "branch_divergence": gr.Plot(divergence, visible=divergence is not None)}


# -- what the panel's events call (values by name -> updates by name) ---------------------------------------------

def show(guard, values: dict, request: gr.Request = None) -> dict:
    """The branch chosen under *Show beside the generation*."""
    shown = values["branch_shown"]
    return guard.ui(request, drawn, values["state"], values["branch_results"] or [],
                    shown if isinstance(shown, int) else -1, values.get("rule") or "top1")


def branch_label(gen, branch, i: int) -> str:
    step, token = branch.forced[-1]
    was = gen.tokens[step] if step < len(gen.tokens) else "…"
    now = f"{charts.show_token(branch.tokens[step])} (#{token})"
    return f"branch {i + 1}: step {step}, {charts.show_token(was)} → {now}"


def listing(gen, results: list, labels: list[str]) -> str:
    if not results:
        return ""
    lines = [f"**The generation:** {_one_line(gen.text)}"]
    for label, branch in zip(labels, results):
        part = parting(gen, branch)
        changes = changed_layers(gen, branch, gen.lens_names[0])
        after = changes[1] if len(changes) > 1 else None
        mind = (f"; at the next step {len(after['layers'])} of {len(gen.steps[0].readout.layers)} layers changed "
                "their top-1" if after else "")
        lines.append(f"- **{md_text(label)}** (parts at step {part}{mind}): {_one_line(branch.text)}")
    return "\n".join(lines)


def _one_line(text: str) -> str:
    """A generated text on one line of Markdown: its line breaks as ↵."""
    return md_text(text.replace("\r", "").replace("\n", " ↵ "))


def step_choices(gen) -> list[tuple[str, int]]:
    return [(f"{s}: {charts.clip(charts.show_token(t), 16)}", s) for s, t in enumerate(gen.tokens)] if gen else []


def source_of(gen, results: list, source) -> tuple:
    """(the generation branched from, its forces) for the *Branch from* choice."""
    i = source if isinstance(source, int) else TRUNK
    if 0 <= i < len(results):
        return results[i], tuple(results[i].forced)
    return gen, ()


def pick_source(guard, values: dict, request: gr.Request = None) -> dict:
    """Branching from another generation: its tokens to click."""
    def choices():
        origin, _ = source_of(values["state"], values["branch_results"] or [], values["branch_source"])
        return {"branch_step": gr.Radio(choices=step_choices(origin), value=None),
                "branch_alternatives": gr.Radio(choices=[], value=None, visible=False)}
    return guard.ui(request, choices)


def pick_step(guard, values: dict, request: gr.Request = None) -> dict:
    """A clicked token's alternatives (or the layer they are read at changed)."""
    return guard.ui(request, lambda: {"branch_alternatives": alternatives_at(
        values["state"], values["branch_results"] or [], values["branch_source"], values["branch_step"],
        values["branch_layer"])})


def alternatives_at(gen, results, source, step, layer):
    """A clicked token's alternatives: the readout's top-k at the output (the deepest layer read) and at `layer`."""
    origin, _ = source_of(gen, results, source)
    if origin is None or not isinstance(step, int) or not 0 <= step < len(origin.steps):
        return gr.Radio(choices=[], value=None, visible=False)
    readout = origin.steps[step].readout
    lens = LOGIT.name if LOGIT.name in readout.lenses else next(iter(readout.lenses))
    r = readout.lenses[lens]
    rows = {len(readout.layers) - 1: "output" if readout.layers[-1] == max(readout.layers) else
            f"layer {readout.layers[-1]}"}
    if layer in readout.layers:
        rows.setdefault(readout.layers.index(layer), f"layer {layer}")
    seen: dict[int, list[str]] = {}
    for row, where in rows.items():
        for token, p in zip(r.top_ids[row, -1], r.top_probs[row, -1]):
            seen.setdefault(int(token), []).append(f"{where} {100 * float(p):.1f}%")
    decode = {int(i): t for i, t in zip(r.top_ids[:, -1].ravel(), (t for layer_ in r.top_tokens for t in layer_[-1]))}
    chosen = origin.token_ids[step]
    return gr.Radio(choices=[(f"{charts.show_token(decode[t])}  ({', '.join(w)})" + (" · the one taken" if t == chosen
                                                                                   else ""), f"#{t}")
                             for t, w in seen.items()], value=None, visible=True)


def grow(service, guard, token_from: str, values: dict, request: gr.Request = None) -> dict:
    """A branch grown from the clicked token with the token in `token_from` (the alternative picked, or the word
    typed), through the guard."""
    return guard.ui(request, add_branch, service, values["state"], values["req"], values["branch_results"] or [],
                    values["branch_source"], values["branch_step"], values[token_from], values.get("rule") or "top1")


def add_branch(service, gen, req, results, source, step, token, rule="top1") -> dict:
    """Branch `source` at `step` with `token` ('#ID', or a word: its first token as it would follow the text there):
    the new branch joins the page's (a branch the page has already is shown again, not added twice)."""
    if gen is None or req is None:
        raise gr.Error("Generate first: a branch grows from the generation on the page.")
    if not isinstance(step, int):
        raise gr.Error("Click a generated token first.")
    _, forces = source_of(gen, results, source)
    chain = f.FORCE([*(x for x in forces if x[0] < step), (step, token)])
    branch = service.generate(dataclasses.replace(req, force=chain))
    say_taken(branch, step)
    chains = [tuple(r.forced) for r in results]
    if tuple(branch.forced) in chains:
        return panel_updates(gen, results, show=chains.index(tuple(branch.forced)), rule=rule, req=req)
    if len(chains) >= MAX_BRANCHES:
        raise gr.Error(f"A page holds at most {MAX_BRANCHES} branches; generate again to start afresh.")
    return panel_updates(gen, [*results, branch], rule=rule, req=req)


def say_taken(branch, step: int) -> None:
    """Which token a branch put at `step` (a word typed is read as it would follow the text: its first token)."""
    gr.Info(html.escape(f"Put {charts.show_token(branch.tokens[step])} (#{branch.token_ids[step]}) at step {step}."))


# -- the chat ------------------------------------------------------------------------------------------------

def build_chat_branch() -> dict[str, gr.components.Component]:
    """The chat's branch box, by name; `chat_last` holds (the request, the reply) of the last reply."""
    with gr.Accordion("Branch the last reply", open=False, elem_id="chat-branch-box"):
        out = {"chat_branch_step": gr.Radio([], label="Click a token of the reply", elem_id="chat-branch-step"),
               "chat_branch_alternatives": gr.Radio([], label="Pick a token to put there (the readout's top-k at "
                                                    "its layer)", elem_id="chat-branch-alternatives"),
               "chat_branch_word": gr.Textbox(label="…or put this word there (as it would follow the text, or #ID)",
                                              elem_id="chat-branch-word")}
    return {**out, "chat_last": kept_state()}


CHAT_UPDATED = ("chat_last", "chat_branch_step", "chat_branch_alternatives")


def chat_steps(last) -> dict:
    """The last reply's tokens to click ((request, reply) in `last`), as `CHAT_UPDATED`."""
    reply = last[1] if last else None
    return {"chat_last": Kept(last, recipe("chat", last[0], "pair")) if last else None,
            "chat_branch_step": gr.Radio(choices=[(f"{s}: {charts.clip(charts.show_token(t), 16)}", s)
                                                  for s, t in enumerate(reply.tokens)] if reply else [], value=None),
            "chat_branch_alternatives": gr.Radio(choices=[], value=None)}


def chat_alternatives(values: dict, request: gr.Request = None) -> dict:
    """The clicked token's alternatives: the readout's top-k at its layer."""
    last, step = values["chat_last"], values["chat_branch_step"]
    reply = last[1] if last else None
    if reply is None or not isinstance(step, int) or not 0 <= step < len(reply.readout):
        return {"chat_branch_alternatives": gr.Radio(choices=[], value=None)}
    choices = [(f"{charts.show_token(t)}  ({100 * p:.1f}%)", f"#{i}")
               for (t, p), i in zip(reply.readout[step], reply.top_ids[step])]
    return {"chat_branch_alternatives": gr.Radio(choices=choices, value=None)}


def grow_chat(service, guard, readout_html, token_from: str, values: dict, request: gr.Request = None) -> dict:
    """The last reply branched at the clicked token with the token in `token_from`, through the guard."""
    return guard.ui(request, chat_branch, service, values["chat_last"], values["chat_branch_step"], values[token_from],
                    values["chatbot"], readout_html)


def chat_branch(service, last, step, token, shown: list, readout_html) -> dict:
    """The last reply branched at `step`: shown under it as a reply of its own, with its readout."""
    if not last:
        raise gr.Error("Send a message first: a branch grows from the last reply.")
    req, reply = last
    if not isinstance(step, int):
        raise gr.Error("Click a token of the reply first.")
    branch = service.chat(dataclasses.replace(req, force=f.FORCE([(step, token)])))
    say_taken(branch, step)
    what = (f"↳ branch at token {step}: {charts.show_token(reply.tokens[step])} → "
            f"{charts.show_token(branch.tokens[step])} (#{branch.token_ids[step]})")
    shown = shown + [{"role": "assistant", "content": html.escape(branch.text, quote=False) or "(empty reply)",
                      "metadata": {"title": what}},
                     {"role": "assistant", "content": readout_html(branch),
                      "metadata": {"title": f"{what}: its readout"}}]
    return {"chatbot": shown, "chat_branch_step": gr.Radio(value=None),
            "chat_branch_alternatives": gr.Radio(choices=[], value=None)}

"""What every tab hands to `build_app`, and the small pieces the tabs share.

A tab is built by a function returning `TabParts`: its permalink fields (view field ->
input component), a function from those inputs' values to a `View`, and its readout handler
with that handler's inputs and outputs. `build_app` wires links, page load and examples from
these alone, so no tab knows another.
"""

from __future__ import annotations

import contextlib
import html
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import gradio as gr
import numpy as np

from .. import charts
from ..config import MAX_K
from ..engine import RequestError
from .permalinks import View

PRIVATE = {"api_visibility": "private"}          # UI events are not API endpoints: /lens and /generate are


@dataclass
class TabParts:
    name: str                                     # the permalink's tab id
    fields: dict[str, gr.components.Component]    # View field -> input component, in `to_view` order
    to_view: Callable[..., View]                  # values of `fields` -> View
    run: Callable | None = None                   # the readout handler (None: tab unavailable)
    run_inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    run_button: gr.Button | None = None
    examples: gr.Examples | None = None

    def values(self, view: View) -> list:
        """Input values for `view`, in `fields` order."""
        return [getattr(view, name) for name in self.fields]


def lens_inputs(tab: str, d: View, layers_label: str):
    """The inputs the logit and Jacobian tabs share: prompt, targets, layers, k, metric, chat (elem ids `{tab}-...`)."""
    with gr.Row():
        prompt = gr.Textbox(label="Prompt", value=d.prompt, lines=2, max_lines=8, scale=3, elem_id=f"{tab}-prompt")
        targets = gr.Textbox(label="Target word(s), comma-separated (optional)", value=d.targets, scale=2,
                             elem_id=f"{tab}-targets")
    with gr.Row():
        layers = gr.Textbox(label=layers_label, value=d.layers, elem_id=f"{tab}-layers")
        k = gr.Number(label="Top-k", value=d.k, minimum=1, maximum=MAX_K, precision=0, elem_id=f"{tab}-k")
        metric = gr.Dropdown(label="Colour cells by", value=d.metric, elem_id=f"{tab}-metric",
                             choices=[(m.title, key) for key, m in charts.METRICS.items()])
        chat = gr.Checkbox(label="Wrap in the chat template (instruct models)", value=d.chat)
    return prompt, targets, layers, k, metric, chat


def call_engine(fn, *args, **kwargs):
    """Run an engine call; bad input becomes a gr.Error with the engine's one-line message."""
    try:
        return fn(*args, **kwargs)
    except RequestError as e:
        raise gr.Error(html.escape(str(e)), title="Can't run that") from None
    except RuntimeError as e:
        raise gr.Error(html.escape(f"The engine failed: {e}"), title="Engine error") from None


def warn(message: str) -> None:
    gr.Warning(html.escape(message))


def split_targets(text: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in (text or "").split(",") if t.strip())


def to_int(value, what: str) -> int:
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise gr.Error(html.escape(f"{what} must be a whole number; got {value!r}")) from None
    if not f.is_integer():
        raise gr.Error(html.escape(f"{what} must be a whole number; got {value!r}"))
    return int(f)


def to_float(value, what: str) -> float:
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise gr.Error(html.escape(f"{what} must be a number; got {value!r}")) from None
    if f != f:                                   # NaN passes float() and every later comparison
        raise gr.Error(html.escape(f"{what} must be a number; got {value!r}"))
    return f


def int_or(value, default: int) -> int:
    """For building a View from inputs mid-edit (an emptied number box): never raises."""
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return default


def lens_source(source: str) -> str:
    """A lens's source for display: a local file by its name only (the server's paths are nobody's business)."""
    return Path(source).name if source and Path(source).exists() else (source or "in memory")


_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|~>])")


def md_text(text: str) -> str:
    """Arbitrary text shown literally inside gr.Markdown (no markup, no HTML)."""
    return _MD_SPECIAL.sub(r"\\\1", html.escape(text, quote=False))


class Exports:
    """Files behind the download buttons, in one temp folder; old ones are pruned."""

    KEEP_SECONDS = 3600

    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="lensapp-exports-"))

    def write(self, stem: str, suffix: str, text: str) -> str:
        now = time.time()
        for old in self.dir.iterdir():
            with contextlib.suppress(FileNotFoundError):     # another handler may prune it first
                if now - old.stat().st_mtime > self.KEEP_SECONDS:
                    old.unlink(missing_ok=True)
        fd, path = tempfile.mkstemp(prefix=f"{stem}-", suffix=suffix, dir=self.dir)
        with open(fd, "w", encoding="utf-8") as f:
            f.write(text)
        return path


# -- lens-result views shared by the logit and Jacobian tabs --------------------------------------

def position_choices(tokens: list[str]) -> list[tuple[str, int]]:
    from ..charts import clip, show_token

    return [(f"{i}: {clip(show_token(t), 24)}", i) for i, t in enumerate(tokens)]


def lens_summary(result, lenses: tuple[str, ...]) -> str:
    """A few lines of Markdown: the model's next token and each target's score at the deepest layer."""
    from ..charts import LENS_TITLES, show_token

    lines = [f"**The model's next token:** {md_text(show_token(result.model_next_token))}  ·  "
             f"{len(result.input_ids)} prompt tokens × {len(result.layers)} layers"]
    last = result.layers[-1]
    for lens in lenses:
        for t in result.lenses[lens].targets:
            p, rank = float(t.probs[-1, -1]), int(t.ranks[-1, -1])
            line = (f"{LENS_TITLES[lens]}, layer {last}: P({md_text(show_token(t.tokens[0]))}) = {100 * p:.1f}% "
                    f"(rank {rank})")
            if len(t.token_ids) > 1:
                whole = float(np.exp(t.continuation_logprob[-1])) if t.continuation_logprob is not None else None
                line += (f"; {md_text(t.text)} is {len(t.token_ids)} tokens, scored by its first"
                         + (f"; the whole word: {100 * whole:.2f}%" if whole is not None else ""))
            lines.append("- " + line)
    return "\n".join(lines)

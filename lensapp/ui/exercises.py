"""A workshop's Exercises panel (`lensapp serve --workshop FILE`, lensapp/workshop.py).

The panel lists the exercises in the file's order, one button each. Opening one restores its link
exactly as opening the link would (`build_ui`'s restore, then that tab's readout) and shows its
question, with the hint folded under it. Each opening is counted (`service/usage.py`): which exercise,
never who. Before the app serves, each exercise's link is read as the page reads it (`check_links`) and the
words it asks for as the model's tokenizer reads them (`check_words`).
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from ..config import MAX_CONTINUATION_TOKENS
from ..results.readout import bare_first
from ..service.field import RequestError
from ..service.selection import index
from ..workshop import Workshop, WorkshopError
from . import permalinks
from .tabs import md_text


@dataclass
class ExercisePanel:
    buttons: list[gr.Button]
    question: gr.Markdown
    hint_box: gr.Accordion
    hint: gr.Markdown

    @property
    def outputs(self) -> list:
        return [self.question, self.hint_box, self.hint]


def check_links(workshop: Workshop) -> None:
    """Every exercise's link read by the page's own decoder: a field it would drop is a mistake (one line each)."""
    mistakes = []
    for i, ex in enumerate(workshop.exercises, 1):
        _, notices = permalinks.decode(ex.query)
        mistakes += [f"exercise {i} ({ex.title}): {n}" for n in notices]
    if mistakes:
        raise WorkshopError("\n".join(f"workshop file: {m}" for m in mistakes))


def check_words(workshop: Workshop, service) -> None:
    """Every exercise opened in the service, as its link opens it (the page's decoder, the service's tokenizer): each
    word it asks the app to read, resolved after its prompt as the app resolves it (service/prompts.py). A word the
    app could read only by a first token that is a bare space or line break cannot mean what the exercise says: one
    line each (WorkshopError). A lens's target is read whole then (results/readout.py's bare_first), unless it is too
    long to; a steering or ablation word and a components target or foil are read by their first token alone."""
    mistakes = []
    for i, ex in enumerate(workshop.exercises, 1):
        view = permalinks.decode(ex.query, prompts=service.prompts).view
        try:
            for word, why in _unreadable_words(view, service.prompts):
                mistakes.append(f"exercise {i} ({ex.title}) asks for {word!r}, {why}, which cannot mean {word!r}")
        except RequestError as e:
            mistakes.append(f"exercise {i} ({ex.title}): {e}")
    if mistakes:
        raise WorkshopError("\n".join(f"workshop file: {m}" for m in mistakes))


def _unreadable_words(view, prompts) -> list[tuple[str, str]]:
    """(word, what the app would read of it) for each word of `view` that the app cannot read as the word."""
    def bare(words, after) -> list:
        return [t for t in prompts.words(words, after) if bare_first(prompts.decode.sequence(list(t.token_ids)))]

    first_only = "whose first token is only whitespace"
    out = []
    for text in view.prompts if view.tab == "compare" else (view.prompt,):
        ids = prompts.ids(text, view.chat)
        if view.tab in ("logit", "jacobian", "compare", "intervene") and view.targets:
            out += [(t.text, f"{first_only} and too long to read whole ({len(t.token_ids)} tokens)")
                    for t in bare(view.targets, ids) if len(t.token_ids) > MAX_CONTINUATION_TOKENS]
        if view.tab == "intervene" and view.intervention in ("steer", "ablate"):
            words = [view.word, view.from_word if view.intervention == "steer" else ""]
            out += [(t.text, first_only) for t in bare([w for w in words if w.strip()], ids)]
        if view.tab == "components":
            after = ids[:index(view.position, len(ids), f"position {view.position} is outside the prompt") + 1]
            out += [(t.text, first_only) for t in bare([w for w in (view.target, view.foil) if w.strip()], after)]
    return out


def build_exercise_panel(workshop: Workshop) -> ExercisePanel:
    with gr.Accordion(f"Exercises ({len(workshop.exercises)})", open=True, elem_id="exercises"):
        gr.Markdown("Open an exercise: its view loads below, with its question here.")
        with gr.Row(elem_classes=["exercise-list"]):
            buttons = [gr.Button(f"{i}. {ex.title}", size="sm", elem_id=f"exercise-{i}", min_width=160)
                       for i, ex in enumerate(workshop.exercises, 1)]
        question = gr.Markdown(visible=False, elem_id="exercise-question")
        with gr.Accordion("Hint", open=False, visible=False, elem_id="exercise-hint") as hint_box:
            hint = gr.Markdown()
    return ExercisePanel(buttons, question, hint_box, hint)


def question_outputs(panel: ExercisePanel, workshop: Workshop, index: int) -> dict:
    """The panel's question and hint for exercise `index` (0-based), as Gradio updates."""
    ex = workshop.exercises[index]
    return {panel.question: gr.Markdown(f"**Exercise {index + 1}: {md_text(ex.title)}**\n\n{md_text(ex.question)}",
                                        visible=True),
            panel.hint_box: gr.Accordion(visible=bool(ex.hint), open=False),
            panel.hint: md_text(ex.hint)}

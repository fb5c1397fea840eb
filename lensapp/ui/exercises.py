"""A workshop's Exercises panel (`lensapp serve --workshop FILE`, lensapp/workshop.py).

The panel lists the exercises in the file's order, one button each. Opening one restores its link
exactly as opening the link would (`build_ui`'s restore, then that tab's readout) and shows its
question, with the hint folded under it. Each opening is counted (`service/usage.py`): which exercise,
never who.
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

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

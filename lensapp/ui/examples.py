"""Curated prompts: each one gives a readable picture on a small model as well as a large one."""

from __future__ import annotations

import gradio as gr

# (prompt, target words): facts, a multilingual fact, arithmetic.
LENS_EXAMPLES = [
    ("The capital of France is", "Paris"),
    ("The Eiffel Tower is located in the city of", "Paris"),
    ("Water boils at", "100"),
    ("La capitale de la France est", "Paris"),
    ("Die Hauptstadt von Deutschland ist", "Berlin"),
    ("12 + 7 =", "19"),
]
GENERATE_EXAMPLES = [
    "The capital of France is",
    "The Eiffel Tower is located in the city of",
    "Water boils at",
    "La capitale de la France est",
    "12 + 7 =",
]
# (prompt 1, prompt 2, targets): contrasts people make in a workshop.
COMPARE_EXAMPLES = [
    ("The capital of France is", "The capital of Italy is", "Paris, Rome"),
    ("The Eiffel Tower is located in the city of", "La tour Eiffel se trouve dans la ville de", "Paris"),
    ("The Eiffel Tower is located in the city of", "The Colosseum is located in the city of", "Paris, Rome"),
    ("Water boils at 100 degrees and freezes at", "Water boils at 50 degrees and freezes at", "0"),
]
CHAT_EXAMPLES = [
    "What is the capital of Japan?",
    "Name three colours of the rainbow.",
    "What is 12 + 7?",
]


def lens_examples(prompt: gr.Textbox, targets: gr.Textbox,
                  label: str = "Examples (click one to run it)") -> gr.Examples:
    return gr.Examples(examples=[list(e) for e in LENS_EXAMPLES], inputs=[prompt, targets], label=label,
                       example_labels=[f"{p}  →  {t}" for p, t in LENS_EXAMPLES], api_visibility="private")


def generate_examples(prompt: gr.Textbox, label: str = "Examples (click one to run it)") -> gr.Examples:
    return gr.Examples(examples=[[p] for p in GENERATE_EXAMPLES], inputs=[prompt], label=label,
                       api_visibility="private")


def compare_examples(first: gr.Textbox, second: gr.Textbox, targets: gr.Textbox,
                     label: str = "Examples (click one to run it)") -> gr.Examples:
    return gr.Examples(examples=[list(e) for e in COMPARE_EXAMPLES], inputs=[first, second, targets], label=label,
                       example_labels=[f"{a}  |  {b}" for a, b, _ in COMPARE_EXAMPLES], api_visibility="private")

"""A link's words: a title and a short note, carried in the URL (`title=`, `note=`), shown above the view.

Nothing is stored: the words live in the link. They are shown as text, never markup (a `<script>` in a
note is the characters `<script>`), and a reference in the note points at cells: "layer 22" outlines
that layer's row, a token in backticks ("`␣city`" or "` city`") the cells that show it, and both
together the cells of that layer that show it.
"""

from __future__ import annotations

import html
import re

import gradio as gr

from .. import config
from ..charts import Highlight
from ..service.field import RequestError
from .tabs import md_text
from .views import NOTE, TITLE, View

_LAYER = re.compile(r"\blayers?\s+(\d+)(?:\s*(?:-|–|to)\s*(\d+))?", re.IGNORECASE)
_TOKEN = re.compile(r"`([^`\n]{1,40})`")
_GLYPHS = {"␣": " ", "↵": "\n", "⇥": "\t"}          # charts.show_token's glyphs, read back


def highlight_of(note, layers) -> Highlight:
    """The cells a note points at among the grid's rows `layers` (none for no note, or one that names no
    layer and no token). The note is read by the link's own field (a RequestError past MAX_NOTE_CHARS), and
    a range selects rows of the grid: what it costs is bounded by the grid, however wide the range."""
    if note is None or note == "":
        return Highlight()
    note = NOTE(note)
    rows, named = set(layers), False
    chosen = set()
    for m in _LAYER.finditer(note):
        lo, hi, named = int(m[1]), int(m[2] or m[1]), True
        chosen.update(layer for layer in rows if lo <= layer <= hi)
    tokens = {"".join(_GLYPHS.get(ch, ch) for ch in t) for t in _TOKEN.findall(note)}
    if named and not chosen:                   # it names layers, none of them drawn: nothing is outlined
        return Highlight()
    return Highlight(frozenset(chosen), frozenset(tokens))


def note_markdown(title, note) -> str:
    """The title and note as Markdown that shows them literally (line breaks kept)."""
    parts = []
    if isinstance(title, str) and title.strip():
        parts.append(f"### {md_text(title)}")
    if isinstance(note, str) and note.strip():
        parts.append("  \n".join(md_text(line) for line in note.splitlines()))
    return "\n\n".join(parts)


def shown(title, note) -> gr.Markdown:
    """The title and note above the view; a value no link could carry (too long, not text) is refused in one
    line, before any of it is rendered."""
    try:
        text = note_markdown(TITLE(title), NOTE(note))
    except RequestError as e:
        raise gr.Error(html.escape(str(e)), title="Can't show that") from None
    return gr.Markdown(text, visible=bool(text))


def with_notes(view: View, title, note) -> View:
    """`view` carrying the boxes' title and note; a value a link could not carry is left out (never raises)."""
    words = {}
    for field, value in ((TITLE, title), (NOTE, note)):
        try:
            words[field.name] = field(value)
        except (TypeError, ValueError):          # RequestError is a ValueError
            continue
    return view.replace(**words)


def note_boxes() -> tuple[gr.Textbox, gr.Textbox]:
    """The title and note boxes of the share-this-view row (made unrendered: the page places them)."""
    title = gr.Textbox(label="Title for the link (optional)", max_length=config.MAX_TITLE_CHARS,
                       render=False, elem_id="link-title")
    note = gr.Textbox(label="Note for the link (optional; 'layer 22' or a token in backticks, like `␣Paris`, "
                      "outlines its cells)", lines=2, max_lines=6, max_length=config.MAX_NOTE_CHARS,
                      render=False, elem_id="link-note-text")
    return title, note

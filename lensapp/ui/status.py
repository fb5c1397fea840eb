"""The engine's state on the page: a line under the header while the model loads, restarts, is busy or is
down, and the run buttons enabled only while it can serve. Polled from the service's health (`wire`)."""

from __future__ import annotations

import gradio as gr

from .. import redact
from .tabs import PRIVATE, TabParts, md_text

POLL_SECONDS = 2.0


def status_line(health: dict) -> str:
    """One line of Markdown for the page's status banner ('' when all is well)."""
    state = health.get("state")
    reason = md_text(redact.paths(health.get("reason") or "unknown"))
    if state == "starting":
        waiting = f" Meanwhile: {md_text(health['reason'])}." if health.get("reason") else ""   # e.g. its service
        return ("⏳ **The model is loading** (vLLM starts and warms up; about a minute on a small CPU). "
                f"The buttons wake up when it is ready; a readout asked for now runs then.{waiting}")
    if state == "restarting":
        return ("⚠️ **The model is restarting** after a failure "
                f"({reason}). Requests in progress were stopped: run them again "
                "once it is back; new ones wait for it.")
    if state == "down":
        return f"⛔ **The model is down**: {reason}. Try again later."
    waiting = int(health.get("queue_depth") or 0)
    if waiting:
        return f"⌛ Busy: {waiting} request{'s' if waiting != 1 else ''} waiting; yours will run in turn."
    return ""


def is_ready(health: dict) -> bool:
    return health.get("state") == "ready"


def banner(service) -> gr.Markdown:
    """The status line as the engine's state has it now: a page's first answer carries it (`ui.restored`), since
    the page's own, built once with the app (often while the model loaded), would say so to every visitor until
    the first poll."""
    return shown_line(status_line(service.status()))


def shown_line(line: str) -> gr.Markdown:
    """The status line's component as `line` shows it: hidden when all is well."""
    return gr.Markdown(line, visible=bool(line))


def wire(service, line_box: gr.Markdown, parts: dict[str, TabParts]) -> None:
    """The status line, and every run button enabled only while the engine can serve. Each open page asks every
    POLL_SECONDS; while its line stays the same nothing is sent back (no redraw in the visitor's browser), and
    what it reads is two counters (`LensService.status`)."""
    buttons = [p.run_button for p in parts.values() if p.run_button is not None]

    synced = gr.State(False)          # this page's buttons have been set once

    def poll(shown: str, was_synced: bool):
        h = service.status()
        line = status_line(h)
        if was_synced and line == (shown or ""):
            return {line_box: gr.skip(), synced: gr.skip(), **{b: gr.skip() for b in buttons}}
        return {line_box: shown_line(line), synced: True,
                **{b: gr.Button(interactive=is_ready(h)) for b in buttons}}

    # No progress shown, and so none set (`tabs.show_progress_on_pictures`): each tick would otherwise set its
    # outputs' loading states, each a walk of the page's whole component tree in the visitor's browser.
    gr.Timer(POLL_SECONDS).tick(poll, [line_box, synced], [line_box, synced, *buttons], queue=False,
                                show_progress="hidden", **PRIVATE)

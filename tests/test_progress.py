"""Where the page shows a running event's progress (`ui/tabs.show_progress_on_pictures`).

Gradio's page keeps a loading state for every component an event has shown progress on, and at every message of
every event sets each one again by a walk of the whole component tree: the load events of a fresh link, which
write every tab's inputs and outputs, cost its first chart ~0.5 s of Chromium's time, and each later event (the
status poll every two seconds) paid for them again (bench/link_speed.py; bench/RESULTS.md). So an event shows
progress on its charts and chat in view, and the page's own events on nothing.
"""

from __future__ import annotations

import gradio as gr


def targets(f) -> list:
    """An event's progress targets as the page takes them (Gradio: its `show_progress_on`, else its outputs)."""
    return list(f.outputs) if f.show_progress_on is None else list(f.show_progress_on)


def test_events_show_progress_on_their_pictures_and_the_pages_own_events_on_nothing(tiny_service):
    from lensapp import config, ui

    demo = ui.build_ui(tiny_service, config.WebSettings(), config.LimitSettings()).demo
    ui_events = [f for f in demo.fns.values() if f.fn is not None and (f.api_name or "").startswith("ui_")]
    assert len(ui_events) > 30
    for f in demo.fns.values():
        for c in targets(f):
            assert isinstance(c, (gr.Plot, gr.Chatbot)) and c.visible is True, (f.name, type(c).__name__)
        if f.show_progress == "hidden":
            assert targets(f) == [], f.name
    loads = [f for f in demo.fns.values() if any(event == "load" for _, event in f.targets)]
    poll = [f for f in demo.fns.values() if any(event == "tick" for _, event in f.targets)]
    assert len(loads) >= 2 and len(poll) == 1
    assert all(targets(f) == [] for f in loads + poll)
    # The tabs' readouts still show progress on what they draw.
    runs = [f for f in ui_events if f.name == "run"]
    assert runs and all(targets(f) for f in runs)

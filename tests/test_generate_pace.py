"""issue 49: a generation written on the page, at a pace the web process and the browser can afford: the first
step's text goes out alone (on the page at once), the charts come after it, each redraw costing its making and its
drawing (estimated from its bytes), and the page's progress is a timer, not a spinner over every output."""

from __future__ import annotations

import pytest

from lensapp import config
from lensapp.ui import generate_tab, tabs
from lensapp.ui.views import TAB_VIEWS, View


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(tabs.time, "monotonic", clock)
    return clock


def test_text_first_sends_the_first_text_alone_then_the_charts_half_a_second_after(clock):
    pace = tabs.Pace(text_first=True)
    assert not pace.charts_due() and pace.text_due()
    pace.texted()
    clock.now += tabs.REDRAW_SECONDS - 0.01
    assert not pace.charts_due() and not pace.text_due()
    clock.now += 0.02
    assert pace.charts_due() and pace.text_due()
    assert tabs.Pace().charts_due()                        # a chat's first step draws its reply at once


def test_a_redraw_waits_for_its_making_and_its_drawing_to_be_a_share_of_the_time(clock):
    made, sent = 0.2, 1_200_000                            # a 64-step pair of heatmaps: 0.2 s to make, 1.2 MB
    for sent_bytes in (0, sent):
        pace = tabs.Pace()
        started = clock.now
        clock.now += made
        pace.drawn(started, sent_bytes)
        wait = (made + sent_bytes / tabs.DRAWN_BYTES_PER_SECOND) * (1 / tabs.REDRAW_SHARE - 1)
        clock.now += tabs.REDRAW_SECONDS
        assert pace.text_due()
        pace.texted()                                      # the text between two redraws brings none forward
        clock.now += wait - tabs.REDRAW_SECONDS - 0.01
        assert not pace.charts_due()
        clock.now += 0.02
        assert pace.charts_due()
    assert wait > 2.0                                      # the big chart: not redrawn more than every 2.4 s


@pytest.fixture(scope="module")
def app(tiny_service):
    from lensapp import ui

    return ui.build_ui(tiny_service, config.WebSettings(), config.LimitSettings(rate_limit=0))


def test_the_pages_generate_yields_its_first_text_alone_and_ends_whole(app, tiny_service):
    view = TAB_VIEWS["generate"]
    values = {**view.values_of(View(tab="generate", prompt="The capital of France is", max_tokens=8)), "rule": "top1"}
    updates = list(generate_tab.run_streamed(view, tiny_service, app.guard, values))
    assert len(updates) >= 2 and set(updates[0]) == {"text"} and updates[0]["text"]
    assert {"state", "heatmap", "text", "table", "strip"} <= set(updates[-1])
    assert updates[-1]["text"].startswith(updates[0]["text"])


def test_the_pages_generate_shows_a_timer_not_a_spinner_over_every_output(app):
    streamed = [f for f in app.demo.fns.values() if f.name == "ui_run_streamed" or f.name == "run_streamed"]
    assert len(streamed) == 2                              # the button or the prompt's Enter; an example clicked
    assert {f.show_progress for f in streamed} == {"minimal"}

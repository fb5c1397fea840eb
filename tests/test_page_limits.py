"""The page's own handlers keep the API's limits: the rate limit and bounded inputs (a note, a window move).

Driven as Gradio calls them, on the tiny random model (transformers backend, in process): `ui.build_ui`'s
handlers with a request from one address.
"""

from __future__ import annotations

import time
from functools import partial
from types import SimpleNamespace

import gradio as gr
import pytest

from lensapp import config
from lensapp.ui import generate_tab, lens_tab
from lensapp.ui.kept import value_of
from lensapp.ui.notes import highlight_of, shown

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:gradio.helpers")

MEGABYTE_NOTE = "layers 0-99999999 " * (1_000_000 // 18)      # ~1 MB of layer ranges, each naming 10^8 layers
LENS_VALUES = {"prompt": "The capital of France is", "layers": "all", "k": 3, "targets": "", "metric": "top1_prob",
               "chat": False, "raw": False, "start": None, "punct": False}


def visitor(address: str = "203.0.113.5"):
    return SimpleNamespace(client=SimpleNamespace(host=address), headers={})


@pytest.fixture(scope="module")
def app(tiny_service):
    from lensapp import ui

    # bursts of 5, then 1 per 10 s
    return ui.build_ui(tiny_service, config.WebSettings(), config.LimitSettings(rate_limit=6))


def refused(fn, *args, **kwargs) -> str:
    """The one line `fn` is refused with (it must be refused)."""
    with pytest.raises(gr.Error) as e:
        fn(*args, **kwargs)
    assert "\n" not in e.value.message
    return e.value.message


def test_a_megabyte_note_from_the_page_is_refused_in_one_line(app):
    lens = app.tabs["logit"]
    move_window = partial(lens_tab.move_window, lens_tab.LOGIT_TAB, app.guard)
    t = time.perf_counter()
    message = refused(lens.run, {**LENS_VALUES, "note": MEGABYTE_NOTE})
    assert "the note has" in message and f"the limit is {config.MAX_NOTE_CHARS}" in message
    result = value_of(lens.run({**LENS_VALUES, "note": "layer 2 and `␣Paris`"})["state"])   # a note within it draws
    assert "the note has" in refused(move_window, {"state": result, "metric": "top1_prob", "window": 0,
                                                   "note": MEGABYTE_NOTE})
    assert "the note has" in refused(shown, "", MEGABYTE_NOTE)            # the note shown above the view
    assert time.perf_counter() - t < 30                                   # refused at once: no 10^8-layer sets


def test_a_notes_ranges_select_rows_of_the_grid_not_numbers_of_the_text():
    note = ("layers 0-99999999 " * 60)[:config.MAX_NOTE_CHARS]
    t = time.perf_counter()
    hl = highlight_of(note, range(30))
    assert hl.layers == frozenset(range(30)) and time.perf_counter() - t < 0.5
    assert highlight_of("layer 40 `␣Paris`", range(30)) == highlight_of(None, range(30))    # no drawn layer named
    assert highlight_of("`␣Paris`", range(30)).marks(7, " Paris")                         # a token on every layer


def test_page_handlers_that_redraw_are_rate_limited_like_a_run(app):
    """A window move, a position, a step and a change each cost one request of the visitor's address."""
    me = visitor("203.0.113.77")
    lens, gen = app.tabs["logit"], app.tabs["generate"]
    move_window = partial(lens_tab.move_window, lens_tab.LOGIT_TAB, app.guard)
    pick_position = partial(lens_tab.pick_position, lens_tab.LOGIT_TAB, app.guard)
    pick_step = partial(generate_tab.pick_step, app.guard)
    result = value_of(lens.run({**LENS_VALUES, "note": ""}, request=me)["state"])                # 1
    steps = value_of(gen.run({"prompt": "Hi", "max_tokens": 2, "temperature": 0.0, "lens": "logit", "layers": "all",
                              "k": 3, "chat": False, "seed": 0, "raw": False}, request=me)["state"])  # 2
    window = {"state": result, "metric": "top1_prob", "window": 0, "note": ""}
    move_window(window, request=me)                                                              # 3
    pick_position({"state": result, "position": 1}, request=me)                                  # 4
    pick_step({"state": steps, "step": 0, "table_lens": "logit"}, request=me)                    # 5
    for handler, values in ((move_window, window), (pick_position, {"state": result, "position": 0}),
                            (pick_step, {"state": steps, "step": 1, "table_lens": "logit"})):
        assert "too many requests" in refused(handler, values, request=me)
    move_window(window, request=visitor("203.0.113.78"))                                         # another address


# -- in Chromium: a note past the box's own limit, as a forged page would send it -----------------------

@pytest.fixture(scope="module")
def tiny_url(tiny_service):
    from tiny_app import served

    from lensapp.server import make_app

    with served(make_app(tiny_service, config.Config.of(rate_limit=0))) as url:
        yield url


def test_a_megabyte_note_typed_past_the_box_is_refused_on_the_page(page, tiny_url):
    """The box stops at MAX_NOTE_CHARS; a page script that sets its value anyway still gets one line."""
    page.goto(tiny_url)
    page.get_by_role("tab", name="Logit lens").first.click()                     # it lands on both lenses
    page.wait_for_selector("#logit-heatmap svg.marks", timeout=120_000)         # the front page's example
    page.eval_on_selector("#link-note-text textarea", """(box, n) => {
        box.removeAttribute("maxlength");
        box.value = "layers 0-99999999 ".repeat(n);
        box.dispatchEvent(new Event("input", {bubbles: true}));
    }""", 1_000_000 // 18)
    page.locator("#logit-run").click()
    toast = page.locator(".toast-body", has_text="the note has").first
    toast.wait_for(timeout=60_000)
    line = next(line for line in toast.inner_text().splitlines() if "the note has" in line)    # one line, whole
    assert line.endswith(f"characters; the limit is {config.MAX_NOTE_CHARS}"), line
    assert not page.errors

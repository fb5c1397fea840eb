"""What a visitor leaves behind is bounded: a page keeps handles, not results (`ui/kept.py`), and Gradio's sessions
are few, short-lived and lean (`ui/sessions.py`). On the tiny app; the Chromium check with the real app is
tests/test_visitors_memory.py."""

from __future__ import annotations

import tracemalloc
import urllib.error
import urllib.request

import gradio as gr
import pytest
from gradio.state_holder import SessionState
from tiny_app import served

from lensapp import config
from lensapp.engine.start.memory import SESSION_BYTES
from lensapp.ui import kept, sessions
from lensapp.ui.kept import Expired, KeptResults
from lensapp.ui.tabs import on


def sized(value) -> int:
    return len(value)


def test_the_store_is_bounded_by_bytes_least_recently_used_first_out():
    store = KeptResults(max_bytes=35, size=sized)
    handles = [store.keep("x" * 10 + str(i)) for i in range(3)]     # 11 bytes each: 33
    store.get(handles[0])                                           # the first is used again: the second is oldest
    fourth = store.keep("y" * 11)
    assert store.bytes == 33 and store.get(fourth) == "y" * 11 and store.get(handles[0]).startswith("x")
    with pytest.raises(Expired, match="run it again"):
        store.get(handles[1])
    assert store.get(None, empty=[]) == [] and store.keep(None) is None


def test_a_value_shown_on_many_pages_is_counted_once_and_freed_with_its_last_handle():
    store = KeptResults(max_bytes=100, size=sized)
    front = "the front page's example"                              # every page shows it
    handles = [store.keep(front) for _ in range(50)]
    assert store.bytes == len(front) and store.stats()["handles"] == 50
    for h in handles[:-1]:
        store.drop(h)
    assert store.bytes == len(front)
    store.drop(handles[-1])
    store.drop(handles[-1])                                         # twice: nothing more happens
    store.drop(12345)                                               # not a handle: ignored
    assert store.bytes == 0 and store.stats()["values"] == 0


def test_handles_are_bounded_too():
    store = KeptResults(max_bytes=1 << 30, size=sized, max_handles=10)
    value = "v"
    handles = [store.keep(value) for _ in range(25)]
    assert store.stats()["handles"] == 10
    with pytest.raises(Expired):
        store.get(handles[0])


def test_one_pages_heavy_value_evicts_its_own_results_never_another_pages():
    """The issue's case: pages that chat and read keep small values; one page keeps a heavy one, then another. The
    heavy page lets go of its own oldest; nobody else loses anything."""
    store = KeptResults(max_bytes=100, size=sized)
    small = {f"page{i}": [store.keep(f"r{i}-{j}", owner=f"page{i}") for j in range(3)] for i in range(6)}  # 72 bytes
    first = store.keep("H" * 20, owner="heavy")                        # 92: kept
    assert store.get(first) == "H" * 20 and store.stats()["evicted"] == 0
    second = store.keep("G" * 20, owner="heavy")                       # 112: the heavy page's oldest goes
    assert store.bytes == 92 and store.get(second) == "G" * 20 and store.stats()["evicted"] == 1
    with pytest.raises(Expired):
        store.get(first)
    third = store.keep("K" * 60, owner="heavy")                        # over half the store: not kept, made again
    assert store.bytes == 92 and store.stats()["evicted"] == 1 and store.stats()["too_large"] == 1
    with pytest.raises(Expired):
        store.get(third)
    for page, handles in small.items():
        assert [store.get(h) for h in handles] == [f"r{page[4:]}-{j}" for j in range(3)]


def test_a_value_larger_than_half_the_store_is_not_kept_and_empties_nothing():
    store = KeptResults(max_bytes=100, size=sized)
    handles = [store.keep(f"value {i:02}", owner=f"p{i}") for i in range(9)]      # 8 bytes each
    huge = store.keep("x" * 51, owner="reader")
    assert store.stats()["too_large"] == 1 and [store.get(h) for h in handles] == [f"value {i:02}" for i in range(9)]
    with pytest.raises(Expired):                                      # its page makes it again (below)
        store.get(huge)


def test_a_kept_state_keeps_in_the_store_its_page_is_given_and_in_no_other():
    mine, theirs = KeptResults(max_bytes=1 << 20, size=sized), KeptResults(max_bytes=1 << 20, size=sized)
    with gr.Blocks() as page:
        with gr.Tab("nested"), gr.Row():
            state = kept.kept_state(empty=[])
    with gr.Blocks():
        elsewhere = kept.kept_state()
    with pytest.raises(RuntimeError, match="keep_in"):                # no store given yet: said, never guessed
        kept.write(state, "a result")
    kept.keep_in(page, mine)
    written = kept.write(state, "a result")
    assert mine.get(written["h"]) == "a result" and theirs.stats()["handles"] == 0
    assert kept.read(state, None) == []                               # its `empty`, kept through `keep_in`
    with pytest.raises(RuntimeError, match="keep_in"):                # another page's state was given no store
        kept.read(elsewhere, written)


def test_a_page_whose_value_was_let_go_has_it_made_again_from_its_recipe():
    made = []

    def remake(recipe, request):
        made.append(recipe)
        return "made from " + recipe

    store = KeptResults(max_bytes=1 << 20, size=sized)
    with gr.Blocks() as page:
        state = kept.kept_state()
    kept.keep_in(page, store, remake)
    page = kept.write(state, kept.Kept("a result", "its recipe"))
    assert page["r"] == "its recipe" and kept.read(state, page) == "a result" and made == []
    store.drop_owner("")                                              # its session was dropped (or evicted)
    assert kept.read(state, page) == "made from its recipe" and made == ["its recipe"]
    assert kept.read(state, page) == "made from its recipe" and len(made) == 1     # kept again, same handle
    with pytest.raises(gr.Error, match="run it again"):
        kept.read(state, {"h": "kept:not-given", "r": None})          # no recipe: one line
    with pytest.raises(gr.Error, match="run it again"):
        kept.read(state, "a value the page was never given")


def test_a_handler_reads_the_value_and_writes_a_handle_retiring_the_one_it_replaces():
    store = KeptResults(max_bytes=1 << 20, size=sized)
    with gr.Blocks() as demo:
        state, box, button = kept.kept_state(), gr.Textbox(), gr.Button()
        parts = {"state": state, "box": box}
        seen = []

        def grow(values, request=None):
            seen.append(values["state"])
            return {"state": (values["state"] or "") + values["box"]}
        on(button.click, grow, parts, ["state", "box"], ["state"])
    kept.keep_in(demo, store)
    (fn,) = [f.fn for f in demo.fns.values() if f.name == "grow"]
    first = fn({state: None, box: "ab"})[state]                     # what the page holds: a handle, no recipe
    assert first["h"].startswith(kept.PREFIX) and first["r"] is None and store.get(first["h"]) == "ab"
    second = fn({state: first, box: "cd"})[state]
    assert seen == [None, "ab"] and store.get(second["h"]) == "abcd"
    assert store.stats()["handles"] == 2          # replaced, retired: an event sent before the write still reads it
    store.max_bytes = 6
    store.keep("x")                                                 # 7 bytes: the retired one goes first
    assert store.get(second["h"]) == "abcd" and store.stats()["handles"] == 2
    with pytest.raises(Expired):
        store.get(first["h"])
    with pytest.raises(gr.Error, match="no longer kept on the server"):
        fn({state: first, box: "ef"})                               # gone, and no recipe: one line, run it again


@pytest.fixture(scope="module")
def tiny_app(tiny_service):
    from lensapp.server import make_app

    app = make_app(tiny_service, config.Config.of(rate_limit=0, sessions=3, session_idle=60.0))
    holder = next(r.app for r in app.routes if hasattr(r, "app") and hasattr(r.app, "state_holder")).state_holder
    return app, holder


def test_a_lean_session_sets_what_gradios_sets_at_a_fraction_of_its_size(tiny_app):
    _, holder = tiny_app
    assert set(vars(sessions.LeanSession(holder.blocks))) == set(vars(SessionState(holder.blocks)))
    tracemalloc.start()
    made = [sessions.LeanSession(holder.blocks) for _ in range(50)]
    size, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert size / len(made) < SESSION_BYTES / 2, size / len(made)
    tracemalloc.start()
    gradios = [SessionState(holder.blocks) for _ in range(5)]
    theirs, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert theirs / len(gradios) > 5 * size / len(made)             # what Gradio's own kept per session


def test_sessions_are_bounded_and_an_idle_one_goes_giving_back_its_results(tiny_app, tiny_service):
    app, holder = tiny_app
    now = [0.0]
    store = KeptResults(1 << 20, size=sized)
    with gr.Blocks() as demo:
        kept.kept_state()
    kept.keep_in(demo, store)
    lean = sessions.LeanSessions(capacity=3, idle_seconds=60, clock=lambda: now[0], on_drop=store.drop_owner)
    lean.set_blocks(demo)
    for i in range(5):
        lean[f"s{i}"]
        store.keep(f"result {i}", owner=f"s{i}")
    assert list(lean.session_data) == ["s2", "s3", "s4"] and store.stats()["handles"] == 3     # two given back
    now[0] = 30.0
    lean["s4"]                                                      # s4's page still asks; s2 and s3 do not
    now[0] = 75.0
    lean.delete_all_expired_state()
    assert list(lean.session_data) == ["s4"] and store.stats()["handles"] == 1 and lean.dropped == 4
    assert holder.capacity == 3 and isinstance(holder, sessions.LeanSessions)     # the app's own, from its settings


def test_gradios_deep_link_route_is_gone(tiny_app):
    app, _ = tiny_app
    with served(app) as url:
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"{url}gradio_api/deep_link?session_hash=anyone", timeout=30)
        assert e.value.code == 404
        with urllib.request.urlopen(url, timeout=30) as page:                # the page itself is served
            assert page.status == 200

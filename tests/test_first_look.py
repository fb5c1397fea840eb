"""A long prompt's first look (`ui/lens_tab.readout`): its drawn window read first, the whole prompt after.

The readout from a position on (`LensService.lens(read_from=...)`) is the whole readout's at those positions, the
others blank; the page draws the same window from it, then `complete` reads the prompt whole. On the tiny random
model (transformers backend, in process), and the window against the whole readout on vLLM.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from lensapp import charts
from lensapp.service import cost
from lensapp.service.cache import ResultCache
from lensapp.service.limits import RateLimiter
from lensapp.service.requests import LensRequest
from lensapp.ui import lens_tab
from lensapp.ui.guard import Guard
from lensapp.ui.kept import value_of

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:gradio.helpers")

LONG = "one two three four five six seven eight nine ten " * 12          # 121 tokens with BOS-less SmolLM's tokenizer
VALUES = {"prompt": LONG, "layers": "all", "k": 3, "targets": "eleven", "metric": "top1_prob", "chat": False,
          "raw": False, "start": None, "punct": False}


def assert_window_equal(part, whole, first: int) -> None:
    """`part` (read from `first`) is `whole` at positions first.., blank before."""
    assert part.read_from == first and whole.read_from == 0 and part.input_tokens == whole.input_tokens
    for name, w in whole.lenses.items():
        p = part.lenses[name]
        assert p.top_ids.shape == w.top_ids.shape
        np.testing.assert_array_equal(p.top_ids[:, first:], w.top_ids[:, first:])
        np.testing.assert_allclose(p.top_probs[:, first:], w.top_probs[:, first:], rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(p.kl_to_final[:, first:], w.kl_to_final[:, first:], rtol=1e-3, atol=1e-5)
        assert p.top_tokens[0][first:] == w.top_tokens[0][first:]
        assert (p.top_ids[:, :first] == -1).all() and np.isnan(p.entropy[:, :first]).all()
        assert p.top_tokens[-1][0] == [""] * p.top_ids.shape[-1]
        for tp, tw in zip(p.targets, w.targets):
            np.testing.assert_allclose(tp.probs[:, first:], tw.probs[:, first:], rtol=1e-4, atol=1e-7)
            np.testing.assert_array_equal(tp.ranks[:, first:], tw.ranks[:, first:])
        for rule, rows in w.decisions().items():
            np.testing.assert_array_equal(p.decisions()[rule][first:], rows[first:])


@pytest.mark.parametrize("extra", [{}, {"skip_punctuation": True, "sublayers": True}])
def test_a_readout_from_a_position_is_the_whole_readout_there(tiny_service, extra):
    req = LensRequest(prompts=(LONG,), lens="both", layers="all", k=3, targets=("eleven",), **extra)
    n = len(tiny_service.prompts.ids(LONG))
    whole = tiny_service.lens(req)[0]
    part = tiny_service.lens(req, read_from=n - 48)[0]
    assert_window_equal(part, whole, n - 48)
    if extra:
        assert part.lenses["logit"].display_tokens[0][:n - 48] == [""] * (n - 48)
        assert_window_equal(part.__class__(**{**vars(part), "lenses": part.after_attention}),
                            whole.__class__(**{**vars(whole), "lenses": whole.after_attention}), n - 48)


def test_a_first_look_costs_its_window():
    whole = cost.readout(389, 30, 1, [], 24_000)
    window = cost.readout(389, 30, 1, [], 24_000, read_positions=48)
    assert whole.cells == 389 * 30 and window.cells == 48 * 30 and window.tokens == 389 * window.forwards


def test_a_cache_holds_what_is_done_or_in_flight():
    cache = ResultCache(4, 1 << 20)
    assert not cache.holds("a")
    seen = []
    cache.get_or_compute("a", lambda: seen.append((cache.holds("a"), cache.holds("a", finished=True))) or 1)
    assert seen == [(True, False)]                                          # in flight while it computes
    assert cache.holds("a") and cache.holds("a", finished=True) and not cache.holds("b")


@pytest.fixture(scope="module")
def guard():
    return Guard(RateLimiter(0))


def test_the_page_draws_a_long_prompts_window_first_then_reads_it_whole(tiny_service, guard):
    tab = lens_tab.LOGIT_TAB
    n = len(tiny_service.prompts.ids(LONG))
    first = lens_tab.readout(tab, tiny_service, dict(VALUES))
    brief = value_of(first["state"])
    assert brief.read_from == n - 48 and lens_tab.first_read(tiny_service, lens_tab.lens_request(
        tab, tiny_service, VALUES)[0], None) == n - 48
    assert not first["window"].visible and not any(b.visible for b in _downloads(first))
    assert [c[1] for c in first["position"].choices] == list(range(n - 48, n))
    assert "Reading the rest" in first["summary"]
    assert lens_tab.complete(tab, tiny_service, guard, {**VALUES, "unread": None}) == {}          # no mark: nothing
    rest = lens_tab.complete(tab, tiny_service, guard, {**VALUES, "unread": first["unread"]})
    whole = value_of(rest["state"])
    assert whole.read_from == 0 and rest["window"].visible and all(b.visible for b in _downloads(rest))
    assert len(rest["position"].choices) == n and "Reading the rest" not in rest["summary"]
    # The same picture: the window's cells as the table a screen reader reads, the top-k table, the strip.
    assert first["grid_table"] == rest["grid_table"] and first["table"].equals(rest["table"])
    assert "unread" not in rest and "unread" not in lens_tab.readout(tab, tiny_service, {**VALUES, "prompt": "Hi"})
    again = lens_tab.readout(tab, tiny_service, {**VALUES, "k": 4})        # another first look of the same prompt
    assert again["unread"] != first["unread"]                               # marks it anew: its change is sent
    one_a_minute = Guard(RateLimiter(1, burst=1))                 # no mark: not a request of the visitor's rate
    visitor = SimpleNamespace(client=SimpleNamespace(host="203.0.113.9"), headers={})
    for mark in (None, "", "not a mark", "[1]", '{"prompt": 3}', 5):         # what a hand-made request may send
        assert lens_tab.complete(tab, tiny_service, one_a_minute, {**VALUES, "unread": mark}, request=visitor) == {}
    edited = {**VALUES, "prompt": LONG + "more", "unread": first["unread"]}
    assert lens_tab.complete(tab, tiny_service, guard, edited) == {}                           # edited since


def test_a_short_prompt_or_a_window_far_from_the_end_is_read_whole_at_once(tiny_service):
    tab = lens_tab.LOGIT_TAB
    short = lens_tab.readout(tab, tiny_service, {**VALUES, "prompt": "The capital of France is"})
    assert value_of(short["state"]).read_from == 0 and "Reading the rest" not in short["summary"]
    early = lens_tab.readout(tab, tiny_service, {**VALUES, "start": 5})
    assert value_of(early["state"]).read_from == 0 and early["window"].visible


def _downloads(out: dict) -> list:
    return [out[kind] for kind in ("csv", "json") if kind in out]


@pytest.mark.engine
def test_a_window_read_first_on_vllm_is_the_whole_readout_there(vllm_service):
    req = LensRequest(prompts=(LONG,), lens="logit", layers="all", k=5, targets=("eleven",))
    n = len(vllm_service.prompts.ids(LONG))
    first = charts.window_of(n, None, charts.DisplaySettings()).start
    assert_window_equal(vllm_service.lens(req, read_from=first)[0], vllm_service.lens(req)[0], first)


def test_a_first_look_takes_the_whole_readout_once_it_is_done(tiny_service, monkeypatch):
    monkeypatch.setattr(tiny_service, "cache", ResultCache(8, 1 << 26))
    req = LensRequest(prompts=(LONG,), lens="logit", layers="all", k=3)
    first = len(tiny_service.prompts.ids(LONG)) - 48
    part = tiny_service.lens(req, read_from=first)[0]
    assert part.read_from == first and tiny_service.lens(req, read_from=first)[0] is part     # cached apart
    whole = tiny_service.lens(req)[0]
    assert whole.read_from == 0 and tiny_service.lens(req, read_from=first)[0] is whole


def test_a_new_run_cancels_the_whole_readout_in_flight(tiny_service):
    """The whole-readout step is wired to a first look's mark and cancelled by each way of running the tab anew."""
    from lensapp import config, ui

    built = ui.build_ui(tiny_service, config.WebSettings(), config.LimitSettings())
    fns = built.demo.fns                                              # {id: BlockFunction}, named as `on` names them
    completing = {i for i, f in fns.items() if f.name == "complete"}
    assert len(completing) == 2                                       # the logit and the Jacobian tab
    # Gradio makes a cancel function beside each listener given `cancels`, on the same triggers
    cancelling = [f for f in fns.values() if f.is_cancel_function and set(f.cancels or []) & completing]
    runs = {tuple(f.targets) for f in fns.values() if f.name == "run"}
    assert len(cancelling) == 2 * 2 and {tuple(f.targets) for f in cancelling} <= runs   # Run or Enter; an example


def test_no_event_a_kept_states_change_starts_writes_that_state(tiny_service):
    """Gradio's JSON sends a change again after an event its change started answers it: the heavy link's page sent
    complete and show_code every ~0.6 s while it stayed open (tests/test_ui_browser.py measures a page's quiet)."""
    from lensapp import config, ui
    from lensapp.ui import kept

    demo = ui.build_ui(tiny_service, config.WebSettings(), config.LimitSettings()).demo
    watched = 0
    for f in demo.fns.values():
        started_by = {demo.blocks[i] for i, event in f.targets if event == "change" and i in demo.blocks}
        for state in (s for s in started_by if kept.is_kept(s)):
            watched += 1
            assert state not in f.outputs, f"{f.name} writes the kept state whose change starts it"
    assert watched >= 3                                  # show_code on the lens tabs and the components tab at least

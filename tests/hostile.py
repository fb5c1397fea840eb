"""Strategies and checks for the hostile-input tests (test_hostile.py): what a hostile client sends, and what
every door must answer.

A value is hostile in type (bools, None, lists where ints go), in range (huge ints, negative zero, NaN and
infinities as floats and as text) or in text (controls, zero-width and RTL marks, emoji, lone surrogates,
megabyte strings). `fields` mixes them into otherwise valid requests, so an example reaches past the first
check. Every call runs under `watch` (a hang fails), and `expect` accepts a normal result or a clear error
whose message is one line.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import threading
from urllib.parse import quote

import gradio as gr
from hypothesis import event, settings
from hypothesis import strategies as st

from lensapp.config import (
    MAX_GENERATE_TOKENS,
    MAX_K,
    MAX_LAYERS_CHARS,
    MAX_PROMPT_CHARS,
    MAX_TARGET_CHARS,
    MAX_TEMPERATURE,
)
from lensapp.lens_kinds import readings
from lensapp.service import RequestError
from lensapp.ui import permalinks as pl

HANG_S = 60                  # a call that takes longer has hung (a normal one takes well under 5 s here)
MAX_MESSAGE = 500            # a clear message is short: user input in it is clipped


# -- strategies ---------------------------------------------------------------------------------------

ODD_CHARS = ("\x00\x07\x1b\x7f\x85\t\n\r\x0b\x0c\x1c\u2028\u2029\u200b\u200c\u200d\u200e\u200f\u202a\u202e"
             "\u2066\ufeff\ufffd<>&'\"\\%;,-.+ İßﬁ٣５😀👩‍👧🏳️‍🌈\U0010ffff")
LONE_SURROGATES = "\ud800\udbff\udc00\udfff"
EDGE_TEXTS = ["", " ", "\n", "\t\r\n", "all", "ALL", "last", "-1", "0", "3", "0,5,-1", "1-2", "-2--1", "3-1",
              "0-999", "0--1", ",", "-", "1,,2", "-0", "+1", "1.5", "1e3", "nan", "NaN", "-nan", "inf", "-inf",
              "Infinity", "1e400", "-1e400", "0x10", "1_0", "٣", "５", " 7 ", "7.0", "-0.0", "True", "None", "null",
              "<script>alert(1)</script>", "<img src=x onerror=alert(1)>", "&amp;", "&lt;b&gt;", "%FF%FE",
              "' OR 1=1 --", "{{7*7}}", "${x}", "\u202eevil", "\u200b", "😀" * 5, "1" * 5000, "9" * 300, "9" * 1000,
              "word " * (MAX_PROMPT_CHARS // 5), "x" * (MAX_PROMPT_CHARS + 1)]
BIG_TEXTS = ["x" * (1 << 20), "😀" * (1 << 18), "a\n" * (1 << 19), "\u200b" * (1 << 20)]   # megabyte prompts
HUGE_INTS = [2**31, 2**32, 2**63, 2**64, 10**100, -(10**100), 10**4000, 10**5000, -(10**5000)]
ODD_NUMBERS = [0, -1, 1, 2, 64, 65, 100, 101, -0.0, 0.0, 0.5, 1.0, 2.0, 2.0000001, 1e308, -1e308, 5e-324,
               math.nan, -math.nan, math.inf, -math.inf, True, False, None]


def texts(surrogates: bool = True, big: bool = True) -> st.SearchStrategy[str]:
    """Random Unicode (controls, zero-width and RTL marks, emoji, lone surrogates when the transport
    carries them), edge strings, and megabyte strings."""
    chars = st.characters(exclude_categories=() if surrogates else ("Cs",))
    odd = ODD_CHARS + (LONE_SURROGATES if surrogates else "")
    edge = EDGE_TEXTS + (["a\ud800b", "\udfff", "Paris, \udc80"] if surrogates else [])
    out = [st.text(st.one_of(chars, st.sampled_from(odd)), max_size=40), st.sampled_from(edge)]
    return st.one_of(*out, *([st.sampled_from(BIG_TEXTS)] if big else []))


def numbers(json_safe: bool = False) -> st.SearchStrategy:
    """Numbers of every wrong type and range: ints, huge ints, floats, NaN and infinities as floats and as
    text, negative zero, bools, None, numeric-looking strings. json_safe: what gradio_client can send (strict
    JSON: no NaN or infinity, no int past 4300 digits; test_api_raw_json sends those by hand)."""
    huge = [n for n in HUGE_INTS if not json_safe or abs(n) < 10**4000]
    odd = [x for x in ODD_NUMBERS if not json_safe or not isinstance(x, float) or math.isfinite(x)]
    return st.one_of(st.integers(-5, 110), st.integers(), st.floats(allow_nan=not json_safe,
                                                                    allow_infinity=not json_safe),
                     st.sampled_from(odd + huge), texts(surrogates=not json_safe, big=False))


def anything(json_safe: bool = False) -> st.SearchStrategy:
    """Any value a client could send where one type is expected."""
    leaf = st.one_of(numbers(json_safe), texts(surrogates=not json_safe, big=False))
    return st.one_of(leaf, st.lists(leaf, max_size=3), st.dictionaries(st.text(max_size=4), leaf, max_size=2))


LAYERS = ["all", "last", "0", "-1", "0,3", "1-2", "2-3", "0,-1"]
LENSES = ["logit", "jacobian", "both"]


def words(max_size: int = 30) -> st.SearchStrategy[str]:
    """Valid text: any Unicode a browser can send (emoji, RTL and zero-width marks, controls), not blank."""
    return st.text(st.one_of(st.characters(exclude_categories=("Cs",)), st.sampled_from(ODD_CHARS)),
                   min_size=1, max_size=max_size).filter(str.strip)


@st.composite
def fields(draw, valid: dict, hostile: dict) -> dict:
    """Keyword arguments: all valid (a quarter of the examples), one hostile field (so an example reaches
    past the first check: the tokenizer, the plan, the engine), or all hostile."""
    names = sorted(hostile)
    bad = draw(st.sampled_from([()] * (len(names) // 3 + 1) + [(n,) for n in names] + [tuple(names)]))
    return {name: draw(hostile[name] if name in bad else strategy) for name, strategy in valid.items()}


def scaled(n: int) -> settings:
    """n examples under the ci profile (40 by default); proportionally more under one with more (dev)."""
    return settings(max_examples=max(1, n * settings.default.max_examples // 40))


# -- checks -------------------------------------------------------------------------------------------

def watch(fn, *args, **kwargs):
    """fn(*args)'s result or the exception it raised (returned, not raised), within HANG_S seconds."""
    box: dict = {}

    def target():
        try:
            box["result"] = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - handed to the caller, which judges it
            box["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(HANG_S)
    assert not t.is_alive(), f"hung for {HANG_S} s: {fn.__qualname__}"
    return box["error"] if "error" in box else box["result"]


def assert_one_line(message: str) -> None:
    assert message and message == message.strip(), repr(message)
    assert len(message.splitlines()) == 1 and "Traceback" not in message, repr(message)
    assert len(message) <= MAX_MESSAGE, f"{len(message)} characters: {message[:200]!r}…"


def expect(outcome, ok_type, errors=(RequestError,)):
    """A normal result of `ok_type`, or one of `errors` with a one-line message; anything else fails."""
    event("refused: " + str(outcome)[:30] if isinstance(outcome, BaseException) else "served")
    if isinstance(outcome, BaseException):
        if not isinstance(outcome, errors):
            raise AssertionError(f"{type(outcome).__name__} escaped: {outcome}") from outcome
        assert_one_line(str(outcome))
        return outcome
    assert isinstance(outcome, ok_type), type(outcome)
    return outcome


def assert_page_error(e: gr.Error) -> None:
    """A page error: one line, escaped (the page renders it as HTML), and the user's fault, not the engine's."""
    assert_one_line(e.message)
    assert "<" not in e.message and ">" not in e.message, e.message
    assert e.title != "Engine error", e.message


# -- requests, links and argument lists --------------------------------------------------------------

def conversations() -> st.SearchStrategy:
    turn = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": words()})
    return st.tuples(st.lists(turn, max_size=3), words()).map(
        lambda t: tuple(t[0]) + ({"role": "user", "content": t[1]},))


def targets_text() -> st.SearchStrategy[str]:
    return st.lists(words(12), max_size=3).map(", ".join)


def queries() -> st.SearchStrategy:
    """A link's query: random text, or parameters (known and unknown names, hostile values) url-encoded."""
    names = st.sampled_from(sorted(pl.view_fields()) + ["v", "__theme", "x" * 300, ""])
    pairs = st.lists(st.tuples(names, st.one_of(texts(big=False), st.sampled_from(["1" * 5000, "%FF%FE", "0-999"]))),
                     max_size=12)
    encoded = pairs.map(lambda ps: "&".join(f"{quote(k, errors='surrogatepass')}={quote(v, errors='surrogatepass')}"
                                            for k, v in ps))
    return st.one_of(texts(), encoded, encoded.map(lambda q: "?" + q), st.none())


NUMBER_TEXTS = ["0", "-1", "1", "5", "100", "101", "64", "65", "2", "2.5", "-0", "-0.0", "nan", "NaN", "inf",
                "-inf", "1e400", "1" * 5000, "9" * 30, "4294967295", "4294967296", "0x10", "٣", "1_0", "", " "]


@st.composite
def cli_argv(draw) -> list[str]:
    """`lens` or `generate` with every option: valid values, but one (or all) hostile."""
    value = st.one_of(texts(big=False), st.sampled_from(NUMBER_TEXTS))
    command = draw(st.sampled_from(["lens", "generate"]))
    valid = {"prompt": st.lists(words(), min_size=1, max_size=3 if command == "lens" else 1),
             "--layers": st.sampled_from(LAYERS[:4] + ["20-29"]), "--k": st.sampled_from(["1", "5", "100"]),
             "--lens": st.sampled_from(LENSES), "--max-prompt-tokens": st.just("512"), "--max-work": st.just("16384")}
    if command == "lens":
        valid["--target"] = words(12)
    else:
        valid.update({"--max-tokens": st.sampled_from(["1", "8", "64"]), "--temperature": st.sampled_from(["0", "2"]),
                      "--seed": st.sampled_from(["0", "7", "4294967295"])})
    hostile = {name: st.lists(value, min_size=0, max_size=5) if name == "prompt" else value for name in valid}
    kw = draw(fields(valid, hostile))
    argv = [command, *kw.pop("prompt")]
    for flag, v in kw.items():
        argv += [flag, v]
    return argv + draw(st.lists(st.sampled_from(["--chat", "--raw", "--json"]), max_size=2, unique=True))


# -- the doors: page handlers, links, the CLI, the API ---------------------------------------------------

def page_outcome(fn, *args):
    """A handler's outputs, or its gr.Error checked as a page error (one line, escaped, the user's fault)."""
    out = expect(watch(fn, *args), (tuple, dict), errors=(gr.Error,))
    if isinstance(out, gr.Error):
        assert_page_error(out)
    return out


DEFAULT_VIEW = pl.View()


def assert_within_limits(view: pl.View) -> None:
    def text_ok(text: str) -> bool:
        return not any(0xD800 <= ord(c) <= 0xDFFF or (ord(c) < 0x20 and c not in "\n\t\r") for c in text)

    assert view.tab in pl.TABS and view.metric in pl.METRICS and view.lens in readings()
    assert view.prompt.strip() and len(view.prompt) <= MAX_PROMPT_CHARS and text_ok(view.prompt)
    assert view.layers.strip() and len(view.layers) <= MAX_LAYERS_CHARS and text_ok(view.layers)
    assert all(len(t) <= MAX_TARGET_CHARS and "," not in t and text_ok(t) for t in view.targets)
    assert type(view.k) is int and 1 <= view.k <= MAX_K
    assert type(view.max_tokens) is int and 1 <= view.max_tokens <= MAX_GENERATE_TOKENS
    assert math.isfinite(view.temperature) and 0 <= view.temperature <= MAX_TEMPERATURE
    assert type(view.chat) is bool


def noticed_fields(notices: list[str]) -> list[str]:
    for n in notices:
        assert isinstance(n, str) and len(n.splitlines()) == 1 and len(n) <= MAX_MESSAGE, repr(n)
    return [m[1] for n in notices if (m := re.match(r"The link's (\w+) ", n)) and m[1] in pl.view_fields()]


class EngineStarted(Exception):
    """Raised where the engine would start: the input passed every check."""


class Starts:
    n = 0

    def __repr__(self) -> str:
        return f"<{self.n} engine starts>"


def run_cli(argv: list[str]) -> tuple[object, str, str]:
    from lensapp import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as e:                            # argparse's own errors
            code = ("argparse", e.code)
        except EngineStarted:
            code = "engine"
    return code, out.getvalue(), err.getvalue()


class Api:
    """The app's API through gradio_client, once its engine is ready (a start is not a hang)."""

    def __init__(self, url: str, start_timeout: float = 600):
        import time
        import urllib.request

        from gradio_client import Client

        deadline = time.monotonic() + start_timeout
        while True:
            with urllib.request.urlopen(url + "health", timeout=30) as r:
                state = json.loads(r.read())["state"]
            if state == "ready" or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert state == "ready", f"the app's engine is {state} after {start_timeout} s"
        self.client = Client(url, verbose=False)

    def __call__(self, endpoint: str, *args):
        return self.client.submit(*args, api_name=endpoint).result(timeout=HANG_S)

    def __repr__(self) -> str:
        return "<the app's API>"


def post_raw(app_url: str, endpoint: str, body: str) -> tuple[int, str, object]:
    """POST a hand-written JSON body to an endpoint (what gradio_client cannot send: NaN, Infinity, escaped
    lone surrogates, 4400-digit ints); (HTTP status, "complete" | "error" | the body, the event's data)."""
    import urllib.error
    import urllib.request

    call = f"{app_url}gradio_api/call{endpoint}"
    req = urllib.request.Request(call, data=body.encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            event_id = json.loads(r.read())["event_id"]
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), None
    with urllib.request.urlopen(f"{call}/{event_id}", timeout=HANG_S) as r:
        stream = r.read().decode()
    kind, data = re.findall(r"^event: (\w+)\ndata: (.*)$", stream, re.M)[-1]
    return 200, kind, json.loads(data)


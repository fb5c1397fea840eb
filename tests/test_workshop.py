"""A workshop file: read and checked at start (one line per mistake, exit 2), its settings, and what was run
counted without personal data. The page's side (the Exercises panel in Chromium) is in test_first_visit.py."""

from __future__ import annotations

import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
from conftest import REPO

from lensapp import config, workshop
from lensapp.service.asks import Ask, asking
from lensapp.service.requests import ChatRequest, LensRequest
from lensapp.service.usage import Usage

SHIPPED = REPO / "workshops" / "where-does-the-answer-appear.yaml"
TEST_FILE = REPO / "tests" / "data" / "workshop.yaml"


@pytest.mark.parametrize("path", [SHIPPED, TEST_FILE], ids=lambda p: p.name)
def test_the_shipped_workshops_load_and_their_links_decode_cleanly(path):
    from lensapp.ui import check_links

    w = workshop.load(path)
    assert len(w.exercises) >= 3 and all(ex.question and ex.query.startswith("v=1&tab=") for ex in w.exercises)
    assert {ex.tab for ex in w.exercises} <= set(w.tabs)
    check_links(w)                                               # the page's own decoder drops nothing


def test_settings_fill_what_the_flags_left_default(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text("title: T\nsettings: {rate_limit: 5, request_timeout: 30, auth: 'host:pw'}\n"
                    "exercises: [{title: A, link: '?tab=logit&prompt=Hi', question: Q}]\n")
    w = workshop.load(path)
    cfg = w.apply(config.Config.of(rate_limit=9))
    assert (cfg.limits.rate_limit, cfg.limits.request_timeout, cfg.secrets.auth_pairs) == (9, 30.0, [("host", "pw")])
    # (the flag wins)


BAD = """\
title: ""
tabs: [logit, admin]
colour: blue
settings: {port: 80, rate_limit: -1}
exercises:
  - title: Fine
    link: "?tab=compare&prompt1=a&prompt2=b"
    question: Where?
  - title: No question
    link: "not a link"
"""


def test_a_malformed_file_is_one_line_per_mistake_and_exit_2_before_anything_heavy(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(BAD)
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "lensapp", "serve", "--port", "1", "--workshop", str(path)],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert time.perf_counter() - t < 30 and out.returncode == 2 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    expected = ["unknown key 'colour'", "title must be a non-empty text", "unknown tab(s) 'admin'",
                "settings: 'port' is the command line's", "settings: rate_limit must be in",
                "exercise 1: its link opens the 'compare' tab", "exercise 2: question must be a non-empty text",
                "exercise 2: link must be an address of this app"]
    assert len(lines) == len(expected), out.stderr
    for line, words in zip(lines, expected):
        assert line.startswith(f"error: workshop file {path}: ") or line.startswith(f"workshop file {path}: ")
        assert words in line, (words, line)


@pytest.mark.parametrize("text, words", [("title: [unclosed\n", "not valid YAML (line 2)"),
                                          ("- a list\n", "it must be a mapping"),
                                          ("title: T\nexercises: []\n", "exercises must be a list of at least one")])
def test_other_malformed_files(tmp_path, text, words):
    path = tmp_path / "w.yaml"
    path.write_text(text)
    with pytest.raises(workshop.WorkshopError) as e:
        workshop.load(path)
    assert len(str(e.value).splitlines()) == 1 and words in str(e.value)


def test_a_link_field_the_page_would_drop_is_a_mistake(tmp_path):
    from lensapp.ui import check_links

    path = tmp_path / "w.yaml"
    path.write_text("title: T\nexercises: [{title: A, link: '?tab=logit&k=500', question: Q}]\n")
    with pytest.raises(workshop.WorkshopError, match=r"exercise 1 \(A\): The link's k was left at its default"):
        check_links(workshop.load(path))


def test_usage_counts_without_prompts_unless_asked():
    usage = Usage(30, ["A", "B"])
    usage.exercise(1)
    usage.record("lens", LensRequest.parse(prompts=["The capital of France is"], lens="logit", layers="20-22"))
    usage.record("lens", LensRequest.parse(prompts=["x" * 120], lens="both", layers="-1"))
    usage.record("chat", ChatRequest.parse(messages=[{"role": "user", "content": "Hi"}], layer=-2))
    got = usage.to_json()
    assert got["exercises"] == {"1. A": 0, "2. B": 1}
    assert got["tabs"] == {"logit": 1, "jacobian": 1, "generate": 1}
    assert got["layers"] == {"20": 1, "21": 1, "22": 1, "28": 1, "29": 1}
    assert got["prompt_chars"] == {"0-19": 1, "20-49": 1, "100-199": 1}
    assert "prompts" not in got and "capital" not in str(got)
    keeping = Usage(30, ["A"], record_prompts=True)
    keeping.record("lens", LensRequest.parse(prompts=["The capital of France is"]))
    assert [p["prompt"] for p in keeping.to_json()["prompts"]] == ["The capital of France is"]


def test_the_service_counts_what_its_ask_says_is_counted(tiny_service):
    """The front page's examples and a link's second look are asked not counted: as a value handed to the service,
    or as the ask its handler was called with (service/asks.py)."""
    usage = Usage(tiny_service.info.n_layers, [])
    req = LensRequest.parse(prompts=["Counted or not"], lens="logit", layers="last")
    before, tiny_service.observer = tiny_service.observer, usage.record
    try:
        tiny_service.lens(req)                                          # the host's own: counted
        tiny_service.lens(req, ask=Ask(counted=False))
        with asking(counted=False):                                     # the front page's example
            tiny_service.lens(req)
            tiny_service.lens(req, ask=Ask())                           # an ask handed down wins
    finally:
        tiny_service.observer = before
    assert usage.summary()["tabs"] == {"logit": 2}


def test_the_front_pages_example_is_pinned_and_not_counted(tiny_service, monkeypatch):
    """`FrontPage.warm` asks through a tab's handler, which carries no ask: the wish to pin and not to count reaches
    the service as the ask the handler was called with, and the guard around the handler keeps it."""
    from lensapp import ui
    from lensapp.service.cache import ResultCache
    from lensapp.ui.front import FrontPage

    monkeypatch.setattr(tiny_service, "cache", ResultCache(0, 0))      # no bounded cache: pinned or nothing
    usage = Usage(tiny_service.info.n_layers, [])
    monkeypatch.setattr(tiny_service, "observer", usage.record)
    built = ui.build_ui(tiny_service, config.WebSettings(), config.LimitSettings(rate_limit=0))
    FrontPage(tiny_service, [built.tabs["logit"]]).warm()
    stats = tiny_service.cache.stats()
    assert stats["pinned"] == stats["misses"] == 1 and stats["hits"] == 1       # the second pass: read, pinned
    assert usage.summary()["tabs"] == {}


def test_the_counts_are_the_hosts_behind_the_login():
    """/workshop: the counts; with a login, only for its credentials (a stand-in service, no engine)."""
    from fastapi.testclient import TestClient

    from lensapp.engine import ModelInfo
    from lensapp.server import make_app

    service = SimpleNamespace(info=ModelInfo("stand-in", 4, 8, 100, "none", "cpu", "float32"), jlens=None,
                              jlens_layers=[], jlens_error=None, chat_layers=lambda lens: [0, 1, 2, 3],
                              model=SimpleNamespace(path="stand-in", family=None), observer=None,
                              health=lambda: {"state": "ready", "queue_depth": 0},
                              status=lambda: {"state": "ready", "reason": "", "queue_depth": 0})
    plan = workshop.load(TEST_FILE)
    with TestClient(make_app(service, config.Config.of(auth="host:secret,alice:pw"), plan)) as client:
        assert client.get("/workshop").status_code == 401
        assert client.get("/workshop", auth=("host", "wrong")).status_code == 401
        got = client.get("/workshop", auth=("host", "secret")).json()
        assert list(got["exercises"]) == [f"{i}. {ex.title}" for i, ex in enumerate(plan.exercises, 1)]
        assert client.get("/health", auth=("host", "secret")).json()["workshop"]["tabs"] == {}
        assert "workshop" not in client.get("/health").json()                 # the counts are the host's
        assert "workshop" not in client.get("/health", auth=("alice", "pw")).json()    # not a participant's
    assert service.observer is not None
    with TestClient(make_app(service, config.Config(), plan)) as client:
        assert client.get("/workshop").status_code == 200                # no login: the host's alone


def test_only_the_hosts_login_reads_what_was_run_and_participants_run_the_app(tiny_service):
    """A workshop with logins for the host and a participant (`auth: "host:...,alice:..."`), the real app served
    over HTTP: alice's login runs a readout, and /workshop (which holds her prompt) refuses her; the host reads it."""
    import base64
    import json
    import urllib.error
    import urllib.request

    from gradio_client import Client
    from tiny_app import served

    from lensapp.server import make_app

    def get(url: str, login: tuple[str, str] | None = None) -> tuple[int, str]:
        headers = {} if login is None else {"Authorization": "Basic " + base64.b64encode(":".join(login).encode())
                                            .decode()}
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    plan = workshop.Workshop("T", config.TABS, workshop.load(TEST_FILE).exercises, {}, record_prompts=True)
    host, alice = ("host", "h0st-pw"), ("alice", "al1ce-pw")
    cfg = config.Config.of(auth=f"{':'.join(host)},{':'.join(alice)}", rate_limit=0)
    with served(make_app(tiny_service, cfg, plan)) as url:
        read = Client(url, auth=alice, verbose=False).predict("alice's own question", "logit", "all", 3,
                                                              api_name="/lens")
        assert read["input_tokens"][-1] == " question"
        for login, status in ((None, 401), (("alice", "wrong"), 401), (alice, 403)):
            code, body = get(url + "workshop", login)
            assert code == status and "alice's own question" not in body, (login, code, body)
        code, body = get(url + "workshop", host)
        assert code == 200 and [p["prompt"] for p in json.loads(body)["prompts"]] == ["alice's own question"]


ASKS = """\
title: Words
tabs: [logit, intervene, components]
exercises:
  - title: Read whole
    link: "?v=1&tab=logit&prompt=12%20%2B%207%20%3D&targets=19&metric=target_prob"
    question: How sure is the model of 19?
  - title: Who wrote 19
    link: "?v=1&tab=components&prompt=12%20%2B%207%20%3D&target=19"
    question: Which head writes 19?
  - title: Steer to 20
    link: "?v=1&tab=intervene&prompt=12%20%2B%207%20%3D&intervention=steer&word=20&layer=2"
    question: Does the answer follow?
  - title: A long number
    link: "?v=1&tab=logit&prompt=12%20%2B%207%20%3D&targets=1234567890123456789"
    question: Is it read?
  - title: Paris
    link: "?v=1&tab=components&prompt=The%20capital%20of%20France%20is&target=Paris&foil=Rome"
    question: Who writes Paris over Rome?
"""


def test_an_exercise_asking_for_a_word_that_cannot_mean_itself_is_one_line_at_start(tmp_path, tiny_service):
    """Opened in the service with the embedded tokenizer: a components target or a steering word read by a bare
    space, and a target too long to read whole, are named; a target read whole and a word are not."""
    from lensapp import ui

    path = tmp_path / "w.yaml"
    path.write_text(ASKS)
    with pytest.raises(workshop.WorkshopError) as e:
        ui.check_words(workshop.load(path), tiny_service)
    lines = str(e.value).splitlines()
    assert [line.split(" asks for ")[0] for line in lines] == [
        "workshop file: exercise 2 (Who wrote 19)", "workshop file: exercise 3 (Steer to 20)",
        "workshop file: exercise 4 (A long number)"]
    assert "'19', whose first token is only whitespace, which cannot mean '19'" in lines[0]
    assert "too long to read whole (20 tokens)" in lines[2]
    ui.check_words(workshop.load(SHIPPED), tiny_service)          # the shipped file asks only for words


def test_serve_stops_on_such_an_exercise_before_the_engine_starts(tmp_path, tiny_model_dir, capsys):
    import argparse
    import socket

    from lensapp import server

    path = tmp_path / "w.yaml"
    path.write_text(ASKS)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = argparse.Namespace(workshop=str(path), model=str(tiny_model_dir), backend="transformers", jlens="none",
                              host="127.0.0.1", port=port)
    assert server.serve(args) == 2
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 3 and said[0].startswith("error: workshop file: exercise 2 (Who wrote 19) asks for '19'")

"""The engine service trusts nothing from the wire, and a page nothing from the engine (issue 36), without vLLM.

The service's own layer (`engine_service.guarded`) runs on uvicorn on loopback in front of a stand-in for
nnsight-serve's app (its routes, its torch.save'd answers, our progress route): the key, compared there, on
every route but /health, refusals logged and slowed, answers made plain. A fake engine (a plain HTTP server)
answers a page with a malicious pickle, which must run no code in the page. And the settings: a key long and
random enough, never on the command line or in a repr; a plain-http engine beyond loopback refused."""

from __future__ import annotations

import argparse
import io
import logging
import pickle
import secrets
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import httpx
import pytest
import torch
from fastapi import FastAPI, Request, Response

from lensapp import cli, config, engine_service
from lensapp.config import Config, ConfigError
from lensapp.engine.run.protocol import StartFailed
from lensapp.engine.run.served import PROGRESS_PATH, RESULT, ServeTrace, Wire, finished

KEY = secrets.token_urlsafe(32)
# Where nothing can start: an address not this machine's (a listen fails at once), a model that is not there.
NOWHERE = ["--host", "203.0.113.1"]
NO_MODEL = ["--model", "/no/such/model"]
GENERATE = "/v1/nnsight/generate"
LOOPBACK = "http://127.0.0.1:6677"


class Completion:
    def __init__(self, token_ids):
        self.token_ids, self.finish_reason = token_ids, "length"


class RequestOutput:
    """What nnsight-serve saves as `tracer.result`: vLLM's finished RequestOutput (the fields a page reads)."""

    def __init__(self, token_ids):
        self.outputs, self.finished, self.prompt = [Completion(token_ids)], True, "not sent on"


class Stranger:
    """Something a trace could save that is not plain data."""


class Evil:
    """An answer that, unpickled unrestricted, opens (creates) the marker file: code run in the page."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


# -- the service's layer, on a stand-in nnsight-serve ------------------------------------------------------------

SAVES = {b"a lens": {"saved": {"readouts": [{"top_ids": torch.tensor([[1, 2]]), "top_probs": torch.rand(1, 2)}],
                               "model_next_id": 7, "steps": (1, 2.5, "x", None, True)},
                     RESULT: RequestOutput([3, 4])},
         b"a stranger": {"saved": {"odd": Stranger()}, RESULT: RequestOutput([3])}}


def stand_in_app():
    """nnsight-serve's routes as it answers them (server.py), with our progress route."""
    app = FastAPI()

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.post(GENERATE)
    async def generate(request: Request) -> Response:
        buffer = io.BytesIO()
        torch.save({"saves": SAVES[await request.body()], "error": None}, buffer)
        return Response(content=buffer.getvalue(), media_type="application/octet-stream")

    engine_service.add_progress_route(app)
    return app


@pytest.fixture(scope="module")
def service():
    import uvicorn

    gate = engine_service.guarded(stand_in_app(), KEY)
    sock = socket.create_server(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(gate, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the stand-in service did not start"
        time.sleep(0.05)
    yield SimpleNamespace(url=f"http://127.0.0.1:{sock.getsockname()[1]}", gate=gate)
    server.should_exit = True
    thread.join(10)


@pytest.fixture
def fresh(service, monkeypatch):
    """The service with no refusals remembered, and short waits (a test's own refusals add up)."""
    service.gate.refusals = engine_service.Refusals()
    monkeypatch.setattr(engine_service, "FIRST_DELAY_S", 0.01)
    monkeypatch.setattr(engine_service, "MAX_DELAY_S", 0.05)
    return service


def status(url: str, path: str, key: str | None, method: str = "GET") -> int:
    headers = {} if key is None else {"ndif-api-key": key}
    return httpx.request(method, url + path, headers=headers, content=b"a lens", timeout=30).status_code


def test_a_wrong_short_or_empty_key_is_refused_on_every_route_but_health(fresh, caplog):
    caplog.set_level(logging.WARNING, logger="lensapp.engine_service")
    wrong = secrets.token_urlsafe(32)
    for key in (None, "", KEY[:8], KEY + "x", wrong):
        for method, path in (("POST", GENERATE), ("GET", PROGRESS_PATH), ("POST", "/v1/nnsight/register/x")):
            assert status(fresh.url, path, key, method) == 401, (key, path)
    assert status(fresh.url, "/health", None) == 200                    # open for probes
    assert status(fresh.url, GENERATE, KEY, "POST") == 200 and status(fresh.url, PROGRESS_PATH, KEY) == 200
    with pytest.raises(StartFailed, match="refused this key"):
        Wire(fresh.url, wrong).post(b"a lens")
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert lines and all("from 127.0.0.1" in line for line in lines)
    assert any("no key" in line for line in lines) and any("a wrong key" in line for line in lines)
    assert not any(secret in line for line in lines for secret in (KEY, KEY[:8], wrong))


def test_refusals_wait_longer_each_time_and_hold_up_no_one_else(service):
    """0.25 s, 0.5 s, 1 s for one address's refusals in a row; a keyed request meanwhile is answered at once."""
    service.gate.refusals = engine_service.Refusals()
    waits = []
    for _ in range(2):
        t = time.monotonic()
        assert status(service.url, GENERATE, "wrong", "POST") == 401
        waits.append(time.monotonic() - t)
    assert waits[0] >= 0.25 and waits[1] >= 0.5
    done = {}

    def refused():
        assert status(service.url, GENERATE, "wrong", "POST") == 401
        done["refused"] = time.monotonic()

    t = time.monotonic()
    third = threading.Thread(target=refused)
    third.start()
    time.sleep(0.1)
    assert status(service.url, PROGRESS_PATH, KEY) == 200
    done["keyed"] = time.monotonic()
    third.join(30)
    assert done["refused"] - t >= 1.0 and done["keyed"] < done["refused"]
    assert engine_service.refusal_delay(1000) == engine_service.MAX_DELAY_S      # bounded


def test_refusals_count_in_a_window_and_forget_the_least_recently_refused_address(monkeypatch):
    monkeypatch.setattr(engine_service, "MAX_PEERS", 3)
    refusals = engine_service.Refusals()
    assert [refusals.count("a", t) for t in (0, 1, 2)] == [1, 2, 3]
    assert refusals.count("a", 2 + engine_service.REFUSAL_WINDOW_S + 1) == 1      # a new window
    for peer in "bcd":                                              # "a" was refused before these three
        refusals.count(peer, 100)
    assert sorted(refusals.by_peer) == ["b", "c", "d"] and refusals.count("a", 100) == 1


def test_an_answer_leaves_as_plain_data_and_a_page_reads_it_weights_only(fresh):
    raw = httpx.post(fresh.url + GENERATE, content=b"a lens", headers={"ndif-api-key": KEY}, timeout=30).content
    reply = torch.load(io.BytesIO(raw), weights_only=True)                  # nothing but plain data in it
    assert reply["saves"][RESULT] == {"outputs": [{"token_ids": [3, 4], "finish_reason": "length"}],
                                      "finished": True}
    out = finished(*Wire(fresh.url, KEY).post(b"a lens"))
    assert out.outputs[0].token_ids == [3, 4]
    want = SAVES[b"a lens"]["saved"]
    assert torch.equal(out.saves["saved"]["readouts"][0]["top_ids"], want["readouts"][0]["top_ids"])
    assert out.saves["saved"]["steps"] == want["steps"] and out.saves["saved"]["model_next_id"] == 7
    with pytest.raises(RuntimeError, match=r"TypeError: saves\['saved'\]\['odd'\] is a .*Stranger"):
        finished(*Wire(fresh.url, KEY).post(b"a stranger"))


# -- a fake engine: a page runs no code it is sent ------------------------------------------------------------

@pytest.fixture
def fake_engine(tmp_path):
    """An HTTP server posing as the engine: /health ok, and every trace answered with a malicious pickle
    (torch.save'd as nnsight-serve's, or a bare pickle)."""
    marker = tmp_path / "ran-code-in-the-page"
    form = {"torch": True}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers.get("content-length", 0)))
            if form["torch"]:
                buffer = io.BytesIO()
                torch.save({"saves": {RESULT: Evil(marker), "saved": {"x": 1}}, "error": None}, buffer)
                body = buffer.getvalue()
            else:
                body = pickle.dumps({"saves": {RESULT: Evil(marker)}, "error": None}, protocol=2)
            self._send(200, body)

        def do_GET(self):  # noqa: N802
            self._send(200, b'{"status": "ok"}')

        def _send(self, code, body):
            self.send_response(code)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield SimpleNamespace(url=f"http://127.0.0.1:{server.server_address[1]}", marker=marker, form=form)
    server.shutdown()


def raised(call) -> BaseException | None:
    try:
        call()
    except Exception as e:  # noqa: BLE001 - what the page said, checked after what it ran
        return e
    return None


@pytest.mark.parametrize("form", ["torch", "pickle"])
def test_a_malicious_answer_runs_no_code_in_the_page(fake_engine, form):
    import asyncio

    fake_engine.form["torch"] = form == "torch"
    wire = Wire(fake_engine.url, KEY)

    async def awaited():
        async with wire.async_client() as client:
            trace = ServeTrace(wire, client)
            trace.blob = b"a trace"
            return await trace
    errors = [raised(lambda: wire.post(b"a trace")), raised(lambda: asyncio.run(awaited()))]
    assert not fake_engine.marker.exists(), "the engine's answer ran code in the page"
    for e in errors:
        assert isinstance(e, StartFailed) and e.permanent, e
        assert "answered with what a page does not read" in str(e) and "\n" not in str(e)


def test_a_page_on_a_malicious_engine_is_down_in_one_line_and_ran_nothing(fake_engine, tiny_model_dir):
    from lensapp.engine.run.errors import EngineDown
    from lensapp.service import LensService

    page = LensService.start(Config.of(model=str(tiny_model_dir), engine_url=fake_engine.url, engine_key=KEY,
                                    jlens="none", cache_entries=0))
    try:
        down = raised(lambda: page.wait_ready(300))
    finally:
        page.close()
    assert not fake_engine.marker.exists(), "the engine's answer ran code in the page"
    assert isinstance(down, EngineDown) and "answered with what a page does not read" in str(down), down
    assert "\n" not in str(down) and KEY not in str(down)


# -- the settings: the key, where it comes from, where it goes, and the wire ----------------------------------

REFUSED = {"empty": "", "short": "hunter2", "one letter": "a" * 64, "a repeated pair": "ab" * 40,
           "31 bytes of hex": secrets.token_hex(31), "42 of base64": secrets.token_urlsafe(31)[:42],
           "with spaces": "correct horse battery staple and then some"}
TAKEN = {"token_urlsafe(32)": secrets.token_urlsafe(32), "token_hex(32)": secrets.token_hex(32),
         "token_urlsafe(48)": secrets.token_urlsafe(48),
         "40 of punctuation": "".join(secrets.choice("!#$%&()*+,-./:;<=>?@[]^_{|}~abcdefXYZ0123") for _ in range(40))}


@pytest.mark.parametrize("key", REFUSED.values(), ids=REFUSED)
def test_a_short_empty_or_plain_key_is_refused_at_a_pages_start(key):
    with pytest.raises(ConfigError, match="secrets.token_urlsafe") as refused:
        Config.of(engine_url=LOOPBACK, engine_key=key)
    assert "\n" not in str(refused.value) and (not key or key not in str(refused.value))


@pytest.mark.parametrize("key", TAKEN.values(), ids=TAKEN)
def test_a_key_of_32_random_bytes_is_taken(key):
    assert Config.of(engine_url=LOOPBACK, engine_key=key).secrets.engine_key == key


def test_the_engine_refuses_to_start_without_a_long_key(monkeypatch, capsys):
    monkeypatch.delenv("LENSAPP_ENGINE_KEY", raising=False)
    assert cli.main(["engine", *NOWHERE]) == 2
    assert "give it and its pages a key" in capsys.readouterr().err
    monkeypatch.setenv("LENSAPP_ENGINE_KEY", "hunter2")
    assert cli.main(["engine", *NOWHERE]) == 2
    err = capsys.readouterr().err
    assert "too short or too plain" in err and "secrets.token_urlsafe(32)" in err and err.count("\n") == 1


@pytest.mark.parametrize("argv", [["engine", *NOWHERE, "--key", KEY], ["engine", *NOWHERE, "--engine-key", KEY],
                                  ["serve", *NOWHERE, "--engine-url", LOOPBACK, "--engine-key", KEY],
                                  ["lens", "Hello", *NO_MODEL, "--engine-url", LOOPBACK, "--engine-key", KEY]],
                         ids=["engine --key", "engine --engine-key", "serve --engine-key", "lens --engine-key"])
@pytest.mark.parametrize("dash", [False, True], ids=["key", "key starting with -"])
def test_a_key_on_the_command_line_is_refused_saying_why(argv, dash, capsys):
    # A key of secrets.token_urlsafe starts with '-' once in 64 (CI drew one): argparse must not read it as a flag.
    argv = [("-" + KEY[1:] if dash else KEY.lstrip("-") or "k") if arg == KEY else arg for arg in argv]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "`ps` shows it" in err and "LENSAPP_ENGINE_KEY" in err and "--engine-key-file" in err
    assert err.count("\n") == 1 and KEY[1:] not in err


def test_the_key_from_a_file_or_the_environment_and_in_no_repr(tmp_path):
    path = tmp_path / "engine-key"
    path.write_text(KEY + "\n")
    parser = argparse.ArgumentParser()
    config.add_arguments(parser, config.ENGINE_SETTINGS)
    from_file = config.from_args(parser.parse_args(["--engine-url", LOOPBACK, "--engine-key-file", str(path)]), {})
    from_env = config.from_args(parser.parse_args(["--engine-url", LOOPBACK]), {"LENSAPP_ENGINE_KEY": KEY})
    assert from_file.secrets.engine_key == from_env.secrets.engine_key == KEY
    assert config.replace(from_file, max_batch=2).secrets.engine_key == KEY          # a replace() reads the same file
    with pytest.raises(ConfigError, match="given twice"):
        Config.of(engine_key_file=str(path), engine_key=secrets.token_urlsafe(32))
    with pytest.raises(ConfigError, match="engine_key_file .*no-such-file"):
        Config.of(engine_key_file=str(tmp_path / "no-such-file"))
    for shown in (repr(from_file), repr(from_env), str(from_env), repr(Wire(LOOPBACK, KEY))):
        assert KEY not in shown
    assert "engine_url" in repr(from_env) and LOOPBACK in repr(Wire(LOOPBACK, KEY))


@pytest.mark.parametrize("url, insecure, ok", [
    ("http://gpu-box:6677", False, False), ("http://10.0.0.5:6677", False, False),
    ("http://gpu-box:6677", True, True), ("https://gpu.example.org", False, True),
    ("http://127.0.0.1:6677", False, True), ("http://127.8.0.1:6677", False, True),
    ("http://localhost:6677", False, True), ("http://[::1]:6677", False, True),
])
def test_a_plain_http_engine_beyond_this_machine_is_refused_unless_insecure(url, insecure, ok):
    if ok:
        assert Config.of(engine_url=url, engine_key=KEY, insecure_engine=insecure).remote.engine_url == url
    else:
        with pytest.raises(ConfigError, match="plain http beyond this machine.*--insecure-engine"):
            Config.of(engine_url=url, engine_key=KEY, insecure_engine=insecure)


def test_insecure_engine_from_its_flag_or_variable(monkeypatch, capsys):
    parser = argparse.ArgumentParser()
    config.add_arguments(parser, config.ENGINE_SETTINGS)
    remote = ["--engine-url", "http://gpu-box:6677"]
    assert config.from_args(parser.parse_args([*remote, "--insecure-engine"]), {"LENSAPP_ENGINE_KEY": KEY}) \
        .remote.insecure_engine
    env = {"LENSAPP_ENGINE_KEY": KEY, "LENSAPP_INSECURE_ENGINE": "true"}
    assert config.from_args(parser.parse_args(remote), env).remote.insecure_engine
    with pytest.raises(ConfigError, match="plain http"):
        config.from_args(parser.parse_args(remote), env | {"LENSAPP_INSECURE_ENGINE": "0"})
    with pytest.raises(ConfigError, match="LENSAPP_INSECURE_ENGINE"):
        config.from_args(parser.parse_args(remote), env | {"LENSAPP_INSECURE_ENGINE": "maybe"})
    monkeypatch.setenv("LENSAPP_ENGINE_KEY", KEY)
    assert cli.main(["lens", "Hello", *NO_MODEL, *remote]) == 2 and "plain http" in capsys.readouterr().err

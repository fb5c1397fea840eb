"""`lensapp engine` (nnsight-serve) and pages on it (`--engine-url`): the in-process answers, two pages at once,
a key required (our layer's; without vLLM: test_engine_trust.py), loopback by default, and a page that waits out
the service's absence and says so.

One engine service for the module: a subprocess on a free loopback port, the embedded model and a random
Jacobian lens. The pages reach it through a relay the tests can cut (the service gone, as a page sees it,
without a minute of vLLM start to bring it back); the extended test kills the service itself. The
in-process reference is the session's `vllm_service`, given the same lens for the module."""

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import CACHE, REPO, _free_port

from lensapp import jlens
from lensapp.service import ChatRequest, GenerateRequest, InterveneRequest, LensRequest

pytestmark = pytest.mark.engine

KEY = secrets.token_urlsafe(32)
LENS_LAYERS = [4, 12, 20, 28]
ENGINE_START_S = 900

LENS = LensRequest(prompts=("The capital of France is", "Water boils at"), lens="both", k=5,
                   targets=("Paris", "one hundred degrees"))
GENERATE = GenerateRequest(prompt="Once upon a time", max_tokens=8, temperature=0.8, seed=7, lens="both", k=3)
CHAT = ChatRequest(messages=({"role": "user", "content": "What is the capital of France?"},), lens="jacobian",
                   max_tokens=6)
INTERVENE = InterveneRequest.parse(prompt="The capital of France is", intervention="steer", word="Rome", layer="22",
                                   alphas="0,0.4", new_tokens=4)


# -- the engine service, a relay to it, and pages on it ---------------------------------------------------

def start_engine(port: int, lens_file, log_path, *more: str) -> subprocess.Popen:
    """`lensapp engine` in its own process group (so the extended test can kill all of it), starting, its key in
    its environment. Without the core binding this process's own engine chose (engine/start/cpu_env.py): the
    service chooses its own."""
    env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_OMP_THREADS_BIND"} | {"LENSAPP_ENGINE_KEY": KEY}
    return subprocess.Popen([sys.executable, "-m", "lensapp", "engine", "--port", str(port),
                             "--jlens", str(lens_file), "--max-batch", "8", "--cache-dir", str(CACHE), *more],
                            cwd=REPO, env=env, stdout=open(log_path, "a"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def until_ready(proc: subprocess.Popen, log_path, starts: int = 1) -> None:
    """Until the engine's log says it serves (the `starts`-th time)."""
    deadline = time.time() + ENGINE_START_S
    while log_path.read_text().count("engine ready") < starts:
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            pytest.fail(f"lensapp engine did not start:\n{log_path.read_text()[-3000:]}")
        time.sleep(1)


def stop(proc: subprocess.Popen, sig=signal.SIGTERM) -> None:
    try:
        os.killpg(proc.pid, sig)
        proc.wait(timeout=90)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


class Relay:
    """A TCP relay on loopback to the engine's port. `cut()` closes it and every connection through it (new
    ones are refused, as a killed service's are); `restore()` opens it again on the same port."""

    def __init__(self, target: int):
        self.target, self.port = target, _free_port()
        self.conns: list[socket.socket] = []
        self.restore()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def restore(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", self.port), reuse_port=False)
        threading.Thread(target=self._accept, args=(self.listener,), daemon=True).start()

    def cut(self) -> None:
        self.listener.close()
        for c in self.conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()
        self.conns.clear()

    def _accept(self, listener) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target))
            except OSError:                      # the service itself is gone: so is the connection
                client.close()
                continue
            self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src, dst) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


@pytest.fixture(scope="module")
def lens_file(tmp_path_factory, model_dims):
    import torch

    d = model_dims["hidden_size"]
    g = torch.Generator().manual_seed(1)
    return jlens.save(tmp_path_factory.mktemp("engine") / "random_jlens.pt",
                      {layer: torch.eye(d) + 0.05 * torch.randn(d, d, generator=g) for layer in LENS_LAYERS},
                      n_prompts=0, provenance={"model": "a random test model", "corpus": "none: a random test lens"})


@pytest.fixture(scope="module")
def engine(tmp_path_factory, lens_file, embedded_dir):
    port = _free_port()
    log = tmp_path_factory.mktemp("engine-log") / "engine.log"
    proc = start_engine(port, lens_file, log)           # loading while the in-process reference starts
    service = SimpleNamespace(port=port, url=f"http://127.0.0.1:{port}", proc=proc, log=log, lens_file=lens_file)
    yield service
    gone_with(service.proc)


def gone_with(proc: subprocess.Popen) -> None:
    """SIGTERM to the service alone: it exits, and vLLM's processes (its group) with it."""
    import psutil

    group = [p for p in psutil.process_iter() if _group(p) == proc.pid and p.pid != proc.pid]
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    _, left = psutil.wait_procs(group, timeout=30)
    for p in left:
        p.kill()
    assert not left, f"processes outlived lensapp engine: {[p.pid for p in left]}"


def _group(p) -> int | None:
    try:
        return None if p.status() == "zombie" else os.getpgid(p.pid)
    except (OSError, Exception):  # noqa: BLE001 - gone while listed
        return None


@pytest.fixture(scope="module")
def relay(engine):
    until_ready(engine.proc, engine.log)
    r = Relay(engine.port)
    yield r
    r.cut()


@pytest.fixture(scope="module")
def page(relay, lens_file):
    """A page's service in this process, on the engine through the relay."""
    from lensapp import config
    from lensapp.service import LensService

    service = LensService.start(config.Config.of(engine_url=relay.url, engine_key=KEY, jlens=str(lens_file),
                                              cache_entries=0, cache_dir=str(CACHE)))
    service.wait_ready(300)
    yield service
    service.close()


@pytest.fixture(scope="module")
def reference(vllm_service, lens_file):
    """The in-process service, with the same lens."""
    vllm_service.load_jlens(str(lens_file))
    yield vllm_service
    vllm_service.install_jlens(None)


@pytest.fixture(scope="module")
def second_page(tmp_path_factory, relay, lens_file):
    """`lensapp serve --engine-url` in its own process: a second web process on the same engine."""
    port = _free_port()
    log_path = tmp_path_factory.mktemp("page") / "page.log"
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "LENSAPP_ENGINE_KEY": KEY}
    proc = subprocess.Popen([sys.executable, "-m", "lensapp", "serve", "--port", str(port), "--engine-url", relay.url,
                             "--jlens", str(lens_file), "--cache-entries", "0",
                             "--cache-dir", str(CACHE)],
                            cwd=REPO, env=env, stdout=open(log_path, "w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.time() + 300
    while health(url).get("state") != "ready":
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            pytest.fail(f"the second page did not start:\n{log_path.read_text()[-3000:]}")
        time.sleep(1)
    yield SimpleNamespace(url=url, proc=proc)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=90)


def health(url: str) -> dict:
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=10) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        return json.loads(e.read())
    except OSError:
        return {}


def post(url: str, key: str | None, **headers: str) -> int:
    """A trace that is not one, with `key` (None: no key) and `headers`: 200 (its own error inside), else the
    refusal's status (401 for the key, 429 when full and asked to say so)."""
    headers = ({"ndif-api-key": key} if key is not None else {}) | headers
    request = urllib.request.Request(url + "/v1/nnsight/generate", data=b"not a trace", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


# -- the same answers ---------------------------------------------------------------------------------------

def assert_same_json(a, b, path="$"):
    """Equal, floats included (the JSON rounds to 5 significant digits)."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            assert_same_json(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_json(x, y, f"{path}[{i}]")
    else:
        assert a == b or (a != a and b != b), f"{path}: {a!r} != {b!r}"       # NaN (the dose's "before") too


def assert_same_lens(a, b):
    assert a.input_ids == b.input_ids and a.model_next_id == b.model_next_id
    for name in b.lenses:
        x, y = a.lenses[name], b.lenses[name]
        assert (x.top_ids == y.top_ids).all(), name
        assert np.abs(x.top_probs - y.top_probs).max() <= 1e-6, name
        assert np.abs(x.entropy - y.entropy).max() <= 1e-5 and np.abs(x.kl_to_final - y.kl_to_final).max() <= 1e-5
    assert_same_json(a.to_json(), b.to_json())


def test_every_readout_on_the_engine_service_is_the_in_process_one(engine, reference, page):
    assert page.health()["backend"] == "vllm-serve" and page.jlens_layers == reference.jlens_layers
    for a, b in zip(page.lens(LENS), reference.lens(LENS)):
        assert set(b.lenses) == {"logit", "jacobian"}
        assert_same_lens(a, b)
    a, b = page.generate(GENERATE), reference.generate(GENERATE)
    assert a.token_ids == b.token_ids and a.text == b.text
    assert_same_json(a.to_json(), b.to_json())
    assert_same_json(page.chat(CHAT).to_json(), reference.chat(CHAT).to_json())
    assert_same_json(page.intervene(INTERVENE).to_json(), reference.intervene(INTERVENE).to_json())


def test_one_engine_holds_one_jacobian_lens_and_refuses_another(page, reference):
    import torch

    from lensapp.engine.run.protocol import JStack, StartFailed

    d, last = page.info.d_model, page.info.n_layers - 1
    other = JStack(layers=(4, last), J=torch.stack([2 * torch.eye(d), torch.eye(d)]).to(torch.bfloat16))
    with pytest.raises(StartFailed, match="holds another Jacobian lens"):
        page.engine.call("install", lambda backend: backend.install_jlens(other))
    assert_same_lens(page.lens(LENS)[0], reference.lens(LENS)[0])     # the engine's own lens still serves


@pytest.mark.extended
def test_a_vector_fitted_on_the_page_steers_the_engine_as_in_process(page, reference):
    """Fitting needs gradients: it runs on the page (transformers, the weights loaded there), then steers."""
    fitted = InterveneRequest.parse(prompt="The capital of France is", intervention="steer", word="Rome", layer="22",
                                    direction="fitted", objective="lens")
    a, b = page.intervene(fitted).to_json(), reference.intervene(fitted).to_json()
    assert a["intervention"]["fit"]["stopped"] == b["intervention"]["fit"]["stopped"] != "time"
    assert_same_json(a, b)


def test_two_web_processes_read_the_same_at_once(page, second_page, reference):
    from gradio_client import Client

    want = [r.to_json() for r in reference.lens(LENS)]
    client = Client(second_page.url, verbose=False)

    def here(i):
        return [r.to_json() for r in page.lens(LENS)]

    def there(i):
        return [client.predict(p, "both", "all", 5, ", ".join(LENS.targets), api_name="/lens") for p in LENS.prompts]

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(here, range(3))) + list(pool.map(there, range(3)))
    for got in answers:
        assert_same_json(got, want)
    assert health(second_page.url)["backend"] == "vllm-serve"
    deadline = time.time() + 180                 # the other page's front page: every tab's example, computed there
    while health(second_page.url).get("front_page") != "ready":
        assert time.time() < deadline, health(second_page.url)
        time.sleep(1)


@pytest.mark.extended      # the page's readouts are tested equal in CI; the command line is the same service
def test_the_command_line_on_the_engine_service_prints_the_in_process_json(relay, reference, lens_file, capsys,
                                                                          monkeypatch):
    from lensapp import cli

    monkeypatch.setenv("LENSAPP_ENGINE_KEY", KEY)
    remote = ["--engine-url", relay.url, "--jlens", str(lens_file), "--cache-dir", str(CACHE), "--json"]
    assert cli.main(["lens", *LENS.prompts, "--lens", "both", "--k", "5", "--target", "Paris", *remote]) == 0
    want = reference.lens(LensRequest(prompts=LENS.prompts, lens="both", k=5, targets=("Paris",)))
    assert_same_json(json.loads(capsys.readouterr().out), [r.to_json() for r in want])
    assert cli.main(["generate", GENERATE.prompt, "--max-tokens", "8", "--temperature", "0.8", "--seed", "7",
                     *remote]) == 0
    want = reference.generate(GenerateRequest(prompt=GENERATE.prompt, max_tokens=8, temperature=0.8, seed=7))
    assert_same_json(json.loads(capsys.readouterr().out), want.to_json())


# -- the door -------------------------------------------------------------------------------------------------

def test_the_engine_refuses_a_trace_without_its_key(engine, relay):
    """Our layer in front of nnsight-serve (each refusal slower: 0.25 s, 0.5 s, ... here ~8 s in all)."""
    from lensapp.engine.run.protocol import StartFailed
    from lensapp.engine.run.served import Wire

    assert post(engine.url, None) == 401 and post(engine.url, "wrong") == 401 and post(engine.url, KEY[:8]) == 401
    assert post(engine.url, KEY) == 200                     # let in: the bad trace comes back as its own error
    with pytest.raises(StartFailed, match="refused this key"):
        Wire(engine.url, "wrong").post(b"not a trace")
    assert health(engine.url) == {"status": "ok"}          # /health stays open for probes
    with pytest.raises(StartFailed, match="refused this key"):
        Wire(engine.url, "wrong").progress()
    assert Wire(engine.url, KEY).progress() > 0             # its vLLM processes' CPU time: a page's stall watch
    log = engine.log.read_text()
    assert "refused POST '/v1/nnsight/generate' from 127.0.0.1: no key" in log and KEY[:8] not in log


def test_the_engine_listens_on_loopback_unless_told(engine, relay, tmp_path):
    import psutil

    listening = {c.laddr.ip for p in [psutil.Process(engine.proc.pid)]
                 for c in p.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
    assert listening == {"127.0.0.1"}
    run = [sys.executable, "-m", "lensapp", "engine", "--port", str(_free_port())]
    keyless = {k: v for k, v in os.environ.items() if k != "LENSAPP_ENGINE_KEY"}
    refused = subprocess.run(run, cwd=REPO, env=keyless, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "give it and its pages a key" in refused.stderr
    refused = subprocess.run(run + ["--key", KEY], cwd=REPO, env=keyless, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "`ps` shows it" in refused.stderr and KEY not in refused.stderr
    wide = subprocess.run(run + ["--host", "0.0.0.0", "--model", str(tmp_path / "no-such-model")], cwd=REPO,
                          env=keyless | {"LENSAPP_ENGINE_KEY": KEY}, capture_output=True, text=True, timeout=120)
    assert wide.returncode == 2 and "WARNING: the engine listens on 0.0.0.0" in wide.stderr, wide.stderr


# -- the service gone, and back --------------------------------------------------------------------------------

def wait_for_state(get_health, state: str, timeout: float = 60) -> dict:
    deadline = time.time() + timeout
    while (h := get_health()).get("state") != state:
        assert time.time() < deadline, f"still {h.get('state')!r} ({h.get('reason')!r}), not {state!r}"
        time.sleep(0.5)
    return h


def test_a_page_waits_out_the_lost_service_says_so_and_answers_again(page, second_page, relay, reference):
    from lensapp.ui.status import status_line

    want = reference.lens(LENS)
    relay.cut()
    try:
        h = wait_for_state(page.health, "restarting")
        assert "does not answer" in h["reason"]
        assert "does not answer" in status_line(h)             # the banner the page shows
        h2 = wait_for_state(lambda: health(second_page.url), "restarting")
        assert "does not answer" in h2["reason"]               # /health, 503, in the other web process
        time.sleep(5)                                          # a while away: still waiting, not down
        assert page.health()["state"] == "restarting"
    finally:
        relay.restore()
    page.wait_ready(120)
    for a, b in zip(page.lens(LENS), want):
        assert_same_lens(a, b)
    wait_for_state(lambda: health(second_page.url), "ready", 120)
    assert page.health()["restarts"] == 0 and second_page.proc.poll() is None


@pytest.mark.extended
def test_the_engine_killed_and_started_again_under_a_page(page, engine, reference):
    """SIGKILL to the whole service (nnsight-serve, vLLM's EngineCore and worker), then a new one on its port."""
    want = reference.lens(LENS)
    stop(engine.proc, signal.SIGKILL)
    h = wait_for_state(page.health, "restarting")
    assert "does not answer" in h["reason"]
    engine.proc = start_engine(engine.port, engine.lens_file, engine.log)
    until_ready(engine.proc, engine.log, starts=2)
    page.wait_ready(300)
    for a, b in zip(page.lens(LENS), want):
        assert_same_lens(a, b)

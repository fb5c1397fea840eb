"""What the app sends compressed, as ASGI middleware (`server.make_app` adds it): the page, its config and the
page's event stream, to a browser or client that takes gzip.

Gradio compresses what it serves by a file's extension (its scripts and styles, Brotli). The rest went out whole:
the page, whose HTML carries the whole config (~370 kB for six tabs), and every answer on the event stream, a
link's chart among them (a pair of heatmaps: 200-330 kB of JSON). Over a phone's link those bytes are most of the
wait (bench/link_speed.py --network).

The event stream must stay a stream: each message written is compressed and flushed at once (a sync flush), so
the browser decodes every message as it comes, where Starlette's own gzip holds an event stream back until a
buffer fills, and so leaves it out. A large message (an API answer can be tens of MB) is compressed on a worker
thread, not on the event loop every visitor's request waits for.
"""

from __future__ import annotations

import zlib

# FastAPI's own names for Starlette's parts (a declared dependency; Starlette comes with it)
from fastapi.concurrency import run_in_threadpool
from fastapi.datastructures import Headers
from fastapi.middleware.gzip import GZipMiddleware

PAGES = ("/", "/config", "/first-view")      # the page (any link), its config, a link's first heatmap: whole
EVENTS = "/gradio_api/queue/data"           # the event stream: compressed message by message
LEVEL = 4                                    # JSON of charts shrinks ~10x at 4; 6-9 cost more and save little
ON_A_THREAD = 128 << 10                      # a message larger than this is compressed off the event loop
# zlib's memory for each open stream: a 32 kB window and memLevel 6, ~160 kB (the default, memLevel 8, ~256 kB)
MEM_LEVEL = 6


class Compressed:
    """ASGI middleware: the page and its config gzipped whole, the page's event stream gzipped message by message,
    for a request that accepts gzip; everything else as Gradio sends it."""

    def __init__(self, app):
        self.app = app
        self.pages = GZipMiddleware(app, minimum_size=1024, compresslevel=LEVEL)

    async def __call__(self, scope, receive, send):
        # the path first: every script and style the page loads passes here, and only two paths are ours
        path = scope.get("path") if scope["type"] == "http" and scope["method"] == "GET" else None
        if path in PAGES:
            await self.pages(scope, receive, send)              # it reads Accept-Encoding itself
        elif path == EVENTS and "gzip" in Headers(scope=scope).get("accept-encoding", ""):
            await self.app(scope, receive, StreamGzip(send))
        else:
            await self.app(scope, receive, send)


class StreamGzip:
    """An ASGI `send` that gzips a response's body as it is written, each part flushed whole."""

    def __init__(self, send):
        self.send = send
        self.gzip: zlib._Compress | None = None      # None: passed through (already encoded)

    async def __call__(self, message) -> None:
        if message["type"] == "http.response.start":
            headers = [(k, v) for k, v in message["headers"] if k.lower() != b"content-length"]
            if not any(k.lower() == b"content-encoding" for k, _ in headers):
                self.gzip = zlib.compressobj(LEVEL, zlib.DEFLATED, 16 + zlib.MAX_WBITS, MEM_LEVEL)
                message = {**message, "headers": [*headers, (b"content-encoding", b"gzip"),
                                                  (b"vary", b"Accept-Encoding")]}
        elif message["type"] == "http.response.body" and self.gzip is not None:
            body, more = message.get("body", b""), message.get("more_body", False)
            if len(body) > ON_A_THREAD:
                body = await run_in_threadpool(self.squeeze, body, more)
            else:
                body = self.squeeze(body, more)
            message = {**message, "body": body}
        await self.send(message)

    def squeeze(self, body: bytes, more: bool) -> bytes:
        return self.gzip.compress(body) + self.gzip.flush(zlib.Z_SYNC_FLUSH if more else zlib.Z_FINISH)

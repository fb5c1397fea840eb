"""The one error path: every failure reaches the user as one line of plain text.

A handler runs through `Guard.ui` (the page's events) or `Guard.api` (the API endpoints): the
client's rate is checked, the engine is told who is asking (its fair turns), the work the engine does
for it is taken from that client's budget as it starts, or refused (`service/limits.py`), and any exception
becomes a `gr.Error` with a one-line message. Who is asking is an address no header a client writes can
change (`service/identity.py`). The page renders an error's message as HTML, so there it is escaped
(text, never markup); API clients get it as it is (no HTML entities). Expected failures (bad input, a
busy or restarting engine) log one line and say it, with any server path shown by its name
(`redact.py`). Anything else is a fault: the visitor reads a short reference, and the server's log has
the same reference with the traceback (an exception's text can hold paths, addresses and settings that
are the host's alone).
"""

from __future__ import annotations

import contextlib
import functools
import html
import logging
import re
import secrets
from typing import Iterator

import gradio as gr

from .. import redact
from ..engine import EngineBusy, EngineError
from ..engine.run.turns import asking
from ..service import identity
from ..service.field import RequestError
from ..service.limits import RateLimited, RateLimiter, paying

log = logging.getLogger(__name__)
_END = object()


def explain(error: BaseException) -> tuple[str, str, bool]:
    """(title, one-line message, expected?) for any failure."""
    if isinstance(error, RateLimited):
        return "Slow down", str(error), True
    if isinstance(error, RequestError):
        return "Can't run that", str(error), True
    if isinstance(error, EngineBusy):
        return "Busy", str(error), True
    if isinstance(error, EngineError):
        return "The model", str(error), True
    return "Engine error", "something failed on the server", False


def one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


class Guard:
    def __init__(self, limiter: RateLimiter, trusted_proxies: int = 0):
        self.limiter, self.trusted_proxies = limiter, trusted_proxies

    def ui(self, request: gr.Request | None, fn, *args, **kwargs):
        """Run a page handler: failures become an escaped, one-line gr.Error."""
        return self._run(request, True, fn, *args, **kwargs)

    def api(self, request: gr.Request | None, fn, *args, **kwargs):
        """Run an API endpoint: failures become a plain-text, one-line gr.Error."""
        return self._run(request, False, fn, *args, **kwargs)

    def ui_stream(self, request: gr.Request | None, fn, *args) -> Iterator:
        """`ui` for a handler that yields (a page written as the model writes): see `_stream`."""
        return self._stream(request, True, fn, *args)

    def api_stream(self, request: gr.Request | None, fn, *args) -> Iterator:
        """`api` for an endpoint that yields (its frames, then its answer): see `_stream`."""
        return self._stream(request, False, fn, *args)

    @contextlib.contextmanager
    def visitor(self, client: str | None) -> Iterator[None]:
        """Work done within this block is `client`'s: it waits in that client's turn (engine/run/turns: the host's,
        None, for the app itself and loopback) and is taken from its budget as it starts, or refused (RateLimited)."""
        turn = None if client is None or identity.is_loopback(client) else identity.turn(client)
        with asking(turn), paying(functools.partial(self.limiter.spend, client)):
            yield

    def answered(self, request: gr.Request | None, size: int) -> None:
        """Count an answer of `size` bytes against whoever asked (`RateLimiter.charge`)."""
        self.limiter.charge(client_address(request, self.trusted_proxies), size)

    def _stream(self, request, escape: bool, fn, *args) -> Iterator:
        """What `fn(*args)` yields, its rate checked once. Gradio runs each step of a generator on whichever worker
        thread is free, so each step is run as the visitor's (turns, budget) on its own, and each failure is one
        line; closed early (a page gone, Stop), it closes `fn`'s generator, which stops the engine's work."""
        items = self._run(request, escape, lambda: iter(fn(*args)))
        client = client_address(request, self.trusted_proxies)
        try:
            while (item := self._guarded(client, escape, next, items, _END)) is not _END:
                yield item
        finally:
            if hasattr(items, "close"):
                items.close()

    def _run(self, request, escape: bool, fn, *args, **kwargs):
        client = client_address(request, self.trusted_proxies)

        def checked():
            self.limiter.check(client)
            return fn(*args, **kwargs)
        return self._guarded(client, escape, checked)

    def _guarded(self, client: str | None, escape: bool, fn, *args):
        """`fn(*args)` as `client`'s work; any failure a one-line gr.Error."""
        try:
            with self.visitor(client):
                return fn(*args)
        except gr.Error:
            raise
        except Exception as e:  # noqa: BLE001 - the one place every failure is turned into a message
            title, message, expected = explain(e)
            if expected:
                message = redact.paths(one_line(message))
                log.info("%s: %s", title, message)
            else:
                reference = secrets.token_hex(4)
                log.exception("request failed (reference %s)", reference)
                message = f"{message} (reference {reference}: the host's log has the details)"
            raise gr.Error(html.escape(message) if escape else message, title=title, print_exception=False) from None


def client_address(request, trusted_proxies: int = 0) -> str | None:
    """The address `request` comes from (`service/identity.py`); None for a call made inside the app (no
    request), `identity.UNIDENTIFIED` for a peer that is not an IP address."""
    if request is None:
        return None
    peer = getattr(getattr(request, "client", None), "host", None)
    headers = getattr(request, "headers", None) or {}
    lines = headers.getlist("x-forwarded-for") if hasattr(headers, "getlist") else [headers.get("x-forwarded-for")]
    return identity.client_address(peer, lines, trusted_proxies) or identity.UNIDENTIFIED

"""The one error path: every failure reaches the user as one line of plain text.

A handler runs through `Guard.ui` (the page's events) or `Guard.api` (the API endpoints): the
client's rate is checked, the engine is told who is asking (its fair turns), the work the engine does
for it is taken from that client's budget as it starts, or refused (`service/limits.py`), and any exception
becomes a `gr.Error` with a one-line message. Who is asking is an address no header a client writes can
change (`service/identity.py`), and behind it the person where one is told apart (a browser that loaded the page,
by its visitor cookie, and a login: `identity.People`), who has limits, a turn and a budget of their own from their
first request: thirty people behind one NAT address are thirty visitors, a script without the cookie is its address.
The page renders an error's message as HTML, so there it is escaped (text, never markup); API clients get it as it
is (no HTML entities). Expected failures (bad input, a busy or restarting engine) log one line and say it, with any
server path shown by its name (`redact.py`). Anything else is a fault: the visitor reads a short reference, and
the server's log has the same reference with the traceback (an exception's text can hold paths, addresses and
settings that are the host's alone).
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
from starlette.requests import cookie_parser

from .. import redact
from ..engine import EngineBusy, EngineError
from ..service import identity
from ..service.asks import Ask, asking
from ..service.field import RequestError
from ..service.limits import RateLimited, RateLimiter, person_key

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
    def __init__(self, limiter: RateLimiter, trusted_proxies: int = 0, people: identity.People | None = None):
        self.limiter, self.trusted_proxies = limiter, trusted_proxies
        self.people = people if people is not None else identity.People()

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

    def asker(self, request: gr.Request | None) -> identity.Asker:
        """Who `request` comes from: its address, and the person behind it where one is told apart."""
        address = client_address(request, self.trusted_proxies)
        return self.people.who(address, visitor_cookie(request), getattr(request, "username", None))

    def ask_of(self, client: identity.Asker | str | None) -> Ask:
        """`client` (an address, or a person behind one) as the service's `Ask`: their work waits in their turn
        (engine/run/turns: the host's, None, for the app itself and loopback) and is taken from their budget as
        it starts, or refused (RateLimited)."""
        asker = client if isinstance(client, identity.Asker) else identity.Asker(client)
        turn = None
        if asker.address is not None and not identity.is_loopback(asker.address):
            turn = identity.turn(asker.address) if asker.person is None else person_key(asker.address, asker.person)
        return Ask(turn, functools.partial(self.limiter.spend, asker))

    @contextlib.contextmanager
    def visitor(self, client: identity.Asker | str | None) -> Iterator[Ask]:
        """Work the handler run within this block asks for is `client`'s (`ask_of`; whether it is counted or kept
        for good stays as the caller said): the handler is Gradio's to call and carries no ask, so the service
        reads it from here (service/asks.py)."""
        ask = self.ask_of(client)
        with asking(client=ask.client, payer=ask.payer) as current:
            yield current

    def answered(self, request: gr.Request | None, size: int) -> None:
        """Count an answer of `size` bytes against whoever asked (`RateLimiter.charge`)."""
        self.limiter.charge(self.asker(request), size)

    def _stream(self, request, escape: bool, fn, *args) -> Iterator:
        """What `fn(*args)` yields, its rate checked once. Gradio runs each step of a generator on whichever worker
        thread is free, so each step is run as the visitor's (turns, budget) on its own, and each failure is one
        line; closed early (a page gone, Stop), it closes `fn`'s generator, which stops the engine's work."""
        asker = self.asker(request)
        items = self._let_in(asker, escape, lambda: iter(fn(*args)))
        try:
            while (item := self._guarded(asker, escape, next, items, _END)) is not _END:
                yield item
        finally:
            if hasattr(items, "close"):
                items.close()

    def _run(self, request, escape: bool, fn, *args, **kwargs):
        return self._let_in(self.asker(request), escape, fn, *args, **kwargs)

    def _let_in(self, asker: identity.Asker, escape: bool, fn, *args, **kwargs):
        """`fn` run as `asker`'s request, its rate checked first."""
        def checked():
            self.limiter.check(asker)
            return fn(*args, **kwargs)
        return self._guarded(asker, escape, checked)

    def _guarded(self, asker: identity.Asker, escape: bool, fn, *args):
        """`fn(*args)` as `asker`'s work; any failure a one-line gr.Error."""
        try:
            with self.visitor(asker):
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


def visitor_cookie(request) -> str | None:
    """The visitor cookie `request` carries (`identity.People.new_visitor`, checked there), if any."""
    headers = getattr(request, "headers", None) or {}
    cookies = headers.get("cookie") if hasattr(headers, "get") else None
    return cookie_parser(cookies).get(identity.VISITOR_COOKIE) if isinstance(cookies, str) else None

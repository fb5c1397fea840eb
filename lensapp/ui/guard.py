"""The one error path: every failure reaches the user as one line of plain text.

A handler runs through `Guard.ui` (the page's events) or `Guard.api` (the API endpoints): the
client's rate is checked, the engine is told who is asking (its fair turns), and any exception
becomes a `gr.Error` with a one-line message. The page renders an error's message as HTML, so there
it is escaped (text, never markup); API clients get it as it is (no HTML entities). Expected
failures (bad input, a busy or restarting engine) log one line; anything else is an engine fault
and logs its traceback.
"""

from __future__ import annotations

import html
import ipaddress
import logging
import re

import gradio as gr

from ..engine import EngineBusy, EngineError
from ..engine.turns import asking
from ..service.field import RequestError
from ..service.limits import RateLimited, RateLimiter, is_loopback

log = logging.getLogger(__name__)


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
    first = (str(error).strip().splitlines() or [""])[0][:300]
    return "Engine error", f"the engine failed ({type(error).__name__}{': ' + first if first else ''})", False


def one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


class Guard:
    def __init__(self, limiter: RateLimiter):
        self.limiter = limiter

    def ui(self, request: gr.Request | None, fn, *args, **kwargs):
        """Run a page handler: failures become an escaped, one-line gr.Error."""
        return self._run(request, True, fn, *args, **kwargs)

    def api(self, request: gr.Request | None, fn, *args, **kwargs):
        """Run an API endpoint: failures become a plain-text, one-line gr.Error."""
        return self._run(request, False, fn, *args, **kwargs)

    def _run(self, request, escape: bool, fn, *args, **kwargs):
        try:
            client = client_address(request)
            self.limiter.check(client)
            with asking(None if client is None or is_loopback(client) else client):     # whose turn (engine/turns)
                return fn(*args, **kwargs)
        except gr.Error:
            raise
        except Exception as e:  # noqa: BLE001 - the one place every failure is turned into a message
            title, message, expected = explain(e)
            if expected:
                log.info("%s: %s", title, one_line(message))
            else:
                log.exception("request failed")
            message = one_line(message)
            raise gr.Error(html.escape(message) if escape else message, title=title, print_exception=False) from None


def client_address(request: gr.Request | None) -> str | None:
    """The client's address: the peer, or the first X-Forwarded-For entry when the peer is a proxy on a
    private network (a Space's front end). A public peer's header is not trusted: it could be forged."""
    if request is None or request.client is None:
        return None
    peer = request.client.host
    forwarded = (request.headers.get("x-forwarded-for") or "").split(",")[0].strip()
    try:
        behind_proxy = ipaddress.ip_address(peer).is_private
    except ValueError:
        behind_proxy = False
    return forwarded if forwarded and behind_proxy else peer

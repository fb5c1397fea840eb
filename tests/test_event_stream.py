"""Gradio's page keeps an answer whose event joined as its event stream closed (`ui/event_stream.py`).

A bare Gradio page with two load events, served behind a middleware that makes the losing order happen every time:
the second load's join reaches Gradio only once the server has closed the page's stream (the first load done), and
the close reaches the page only after that join's answer. Gradio's page as shipped then never shows the second
answer; mended, it opens its stream again and shows it. In CI the app's front page once lost its first chart so.
"""

from __future__ import annotations

import asyncio

from tiny_app import served

from lensapp.ui import event_stream, first_view, sessions

JOIN, STREAM = "/gradio_api/queue/join", "/gradio_api/queue/data"


class LosingOrder:
    """ASGI middleware: the join naming `late_fn` waits until the stream has said `close_stream`, and that close
    is sent to the page only after the late join's answer has been (plus `lag` seconds)."""

    def __init__(self, app, late_fn: int, lag: float = 0.4):
        self.app, self.late_fn, self.lag = app, late_fn, lag
        self.closing, self.joined = asyncio.Event(), asyncio.Event()

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")
        if scope["type"] == "http" and path == JOIN:
            body = await _body(receive)
            late = f'"fn_index":{self.late_fn},'.encode() in body.replace(b" ", b"")
            if late:
                await asyncio.wait_for(self.closing.wait(), 10)
            await self.app(scope, _replay(body), self._answered(send) if late else send)
        elif scope["type"] == "http" and path == STREAM:
            await self.app(scope, receive, self._held_close(send))
        else:
            await self.app(scope, receive, send)

    def _answered(self, send):
        async def sending(message):
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                self.joined.set()
        return sending

    def _held_close(self, send):
        async def sending(message):
            if message["type"] == "http.response.body" and b"close_stream" in message.get("body", b""):
                self.closing.set()
                await asyncio.wait_for(self.joined.wait(), 10)
                await asyncio.sleep(self.lag)
            await send(message)
        return sending


async def _body(receive) -> bytes:
    chunks, more = [], True
    while more:
        message = await receive()
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    return b"".join(chunks)


def _replay(body: bytes):
    sent = False

    async def receive():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await asyncio.Event().wait()         # as a client that stays connected
    return receive


def two_loads(mend: bool):
    """A bare Gradio page whose two load events write #first and #second, served in the losing order."""
    import gradio as gr
    from fastapi import FastAPI

    with gr.Blocks() as demo:
        first, second = gr.Textbox(elem_id="first"), gr.Textbox(elem_id="second")
        demo.load(lambda: "first answer", None, first)
        demo.load(lambda: "second answer", None, second)
    app = gr.mount_gradio_app(FastAPI(), demo, path="/")
    if mend:
        assert event_stream.install(sessions.mounted(app))
    return LosingOrder(app, late_fn=max(demo.fns))


def shown(page, url: str, wait_ms: int) -> str:
    page.goto(url)
    page.wait_for_function("() => document.querySelector('#first textarea')?.value === 'first answer'",
                           timeout=30_000)
    try:
        page.wait_for_function("() => document.querySelector('#second textarea')?.value === 'second answer'",
                               timeout=wait_ms)
    except Exception:  # noqa: BLE001 - playwright's TimeoutError: what the page shows is the answer
        pass
    return page.locator("#second textarea").input_value()


def test_an_answer_whose_event_joined_as_the_stream_closed_reaches_the_page(page):
    with served(two_loads(mend=True)) as url:
        assert shown(page, url, 10_000) == "second answer"


def test_gradio_as_shipped_loses_that_answer(page):
    """The order above is the one that loses an answer: if Gradio's own page keeps it, the mend is no longer
    needed (drop `ui/event_stream.py`)."""
    with served(two_loads(mend=False)) as url:
        assert shown(page, url, 5_000) == "", "Gradio's page now keeps it: ui/event_stream.py can go"


def test_the_installed_gradio_has_the_line_to_mend():
    module = event_stream.entry_module(first_view.gradio_assets())
    text = event_stream.mended(module.read_text(encoding="utf-8"))
    assert text is not None and text.count("open_stream();return}") == 1

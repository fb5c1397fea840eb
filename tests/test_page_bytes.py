"""A link's page is sent compressed (issue 50, a phone): the page's HTML carries the whole config (every tab's
components and events), and Gradio compresses only what it serves by a file's extension, so the page went out
whole. The real app (`server.make_app`) on a stand-in service, through Starlette's test client."""

from __future__ import annotations

import gzip

import pytest
from fastapi.testclient import TestClient
from test_privacy import stand_in

from lensapp import config
from lensapp.server import make_app

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:gradio.helpers")


@pytest.fixture(scope="module")
def visitor():
    with TestClient(make_app(stand_in(state="ready"), config.Config())) as client:
        yield client


@pytest.mark.parametrize("path", ["/", "/?tab=logit&prompt=The%20capital%20of%20France%20is", "/config"])
def test_the_page_and_its_config_are_sent_compressed(visitor, path):
    whole = visitor.get(path, headers={"Accept-Encoding": "identity"})
    sent = visitor.get(path, headers={"Accept-Encoding": "gzip"})
    assert whole.status_code == sent.status_code == 200
    assert "content-encoding" not in whole.headers and sent.headers["content-encoding"] == "gzip"
    assert sent.headers["vary"] == "Accept-Encoding"
    assert len(gzip.compress(whole.content)) < whole.num_bytes_downloaded / 4           # worth compressing
    assert sent.num_bytes_downloaded < whole.num_bytes_downloaded / 4
    assert sent.text == whole.text                                                      # the same page



def test_an_event_stream_is_compressed_message_by_message():
    """Each message written is whole on the visitor's side as soon as it is sent (a stream stays a stream), a large
    one too (compressed off the event loop); the response says it is gzip; one already encoded passes as it is."""
    import zlib

    import anyio

    from lensapp import compressed

    messages = [b"data: " + (b'{"msg": "heartbeat"}' if i % 2 else b'{"chart": "' + b"x" * 200_000 + b'"}') + b"\n\n"
                for i in range(4)]

    async def stream(headers):
        sent = []

        async def send(message):
            sent.append(message)
        gzip_send = compressed.StreamGzip(send)
        await gzip_send({"type": "http.response.start", "status": 200, "headers": headers})
        for i, body in enumerate(messages):
            await gzip_send({"type": "http.response.body", "body": body, "more_body": i < len(messages) - 1})
        return sent

    sent = anyio.run(stream, [(b"content-type", b"text/event-stream")])
    head = dict(sent[0]["headers"])
    assert head[b"content-encoding"] == b"gzip" and b"accept-encoding" in head[b"vary"].lower()
    reader = zlib.decompressobj(16 + zlib.MAX_WBITS)
    for message, body in zip(sent[1:], messages):
        assert reader.decompress(message["body"]) == body            # whole as soon as it is sent
    assert reader.eof and sum(len(m["body"]) for m in sent[1:]) < sum(map(len, messages)) / 20
    as_sent = anyio.run(stream, [(b"content-type", b"text/event-stream"), (b"content-encoding", b"br")])
    assert [m.get("body") for m in as_sent[1:]] == messages

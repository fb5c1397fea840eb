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


"""Private by default: /health shows everyone whether the app serves and the host the rest; prompts kept for a
workshop need its login; no page, snippet, error or JSON a visitor can read names a folder of the server.

The real app (`server.make_app`) over the tiny service, through Starlette's test client (its peer is
"testclient", not this machine) and through gradio_client on loopback (`tiny_app.py`).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from conftest import CACHE, REPO, WORKSHOP
from fastapi.testclient import TestClient
from tiny_app import served

from lensapp import config, server, workshop
from lensapp.engine import ModelInfo
from lensapp.server import PUBLIC_HEALTH, make_app
from lensapp.service import InterveneRequest, LensRequest

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:gradio.helpers")
SECRET_REASON = "the model could not start: no config.json in /root/.cache/lensapp/models/private-folder"


def stand_in(**health):
    """A service that only answers what the page is built from, and a /health full of the host's business."""
    full = {"state": "down", "reason": SECRET_REASON, "queue_depth": 2, "model": "stand-in", "restarts": 5,
            "memory": {"plan": {"total_mb": 3000}}, "cache": {"entries": 3}, **health}
    return SimpleNamespace(info=ModelInfo("stand-in", 4, 8, 100, "none", "cpu", "float32"), jlens=None,
                           jlens_layers=[], jlens_error=None, chat_layers=lambda lens: [0, 1, 2, 3],
                           model=SimpleNamespace(path="stand-in", family=None), observer=None,
                           health=lambda: dict(full),
                           status=lambda: {k: full[k] for k in ("state", "reason", "queue_depth")},
                           idle=lambda: full["state"] == "ready" and not full["queue_depth"])


def server_paths(*extra) -> list[str]:
    """Text that would name a folder of this server."""
    return [str(REPO), str(CACHE), str(Path.home()), "/root/", "/home/", *map(str, extra)]


def assert_no_server_path(text: str, *extra) -> None:
    for path in server_paths(*extra):
        assert path not in text, f"{path!r} in {text[:300]!r}..."


def test_health_shows_everyone_the_state_and_the_host_the_rest():
    cfg = config.Config.of(auth="host:secret", health_token="t0ken")
    with TestClient(make_app(stand_in(), cfg)) as visitor:
        seen = visitor.get("/health")
        assert seen.status_code == 503 and set(seen.json()) <= set(PUBLIC_HEALTH)
        assert seen.json() == {"state": "down", "ready": False, "front_page": "computing", "queue_depth": 2}
        assert_no_server_path(seen.text)
        for denied in ({"Authorization": "Bearer wrong"}, {"Authorization": "Basic aG9zdDp3cm9uZw=="},
                       {"X-Forwarded-For": "127.0.0.1"}):           # no proxy trusted: a header is not an address
            assert "reason" not in visitor.get("/health", headers=denied).json()
        for allowed in ({"auth": ("host", "secret")}, {"headers": {"Authorization": "Bearer t0ken"}}):
            assert visitor.get("/health", **allowed).json()["reason"] == SECRET_REASON
    with TestClient(make_app(stand_in(), config.Config()), client=("127.0.0.1", 50000)) as host:
        assert host.get("/health").json()["memory"]["plan"]["total_mb"] == 3000      # this machine is the host's
    with TestClient(make_app(stand_in(), config.Config.of(trusted_proxies="1")), client=("10.0.0.5", 50000)) as proxied:
        assert "reason" not in proxied.get("/health", headers={"X-Forwarded-For": "127.0.0.1, 203.0.113.5"}).json()


def test_prompts_kept_for_a_workshop_need_its_login(tmp_path, capsys):
    data = yaml.safe_load(WORKSHOP.read_text()) | {"record_prompts": True}
    open_file, closed_file = tmp_path / "open.yaml", tmp_path / "closed.yaml"
    open_file.write_text(yaml.safe_dump(data))
    closed_file.write_text(yaml.safe_dump(data | {"settings": {"auth": "host:secret"}}))
    assert server.serve(argparse.Namespace(workshop=str(open_file))) == 2             # before anything starts
    said = capsys.readouterr().err.strip()
    assert "\n" not in said and "record_prompts: true needs a login" in said
    plan = workshop.load(closed_file)
    cfg = plan.apply(config.Config())
    service = stand_in(state="ready")
    with TestClient(make_app(service, cfg, plan)) as client:
        service.observer("lens", LensRequest.parse(prompts=["my private question"]))
        assert client.get("/workshop").status_code == 401 and "private" not in client.get("/workshop").text
        assert client.get("/workshop", auth=("host", "secret")).json()["prompts"][0]["prompt"] == "my private question"


@pytest.fixture(scope="module")
def tiny_url(tiny_service):
    with served(make_app(tiny_service, config.Config.of(rate_limit=0))) as url:
        yield url


def test_the_page_health_and_snippets_name_no_server_folder(tiny_service, tiny_model_dir):
    from lensapp.ui import intervene_tab, lens_tab

    with TestClient(make_app(tiny_service, config.Config())) as visitor:
        assert_no_server_path(visitor.get("/config").text, tiny_model_dir)       # the whole page, as built
        assert_no_server_path(visitor.get("/health").text, tiny_model_dir)
    with TestClient(make_app(tiny_service, config.Config()), client=("127.0.0.1", 50000)) as host:
        assert_no_server_path(host.get("/health").text, tiny_model_dir)          # the host's view names none either
    result = tiny_service.lens(LensRequest(prompts=("The capital of France is",), lens="logit"))[0]
    for form in ("transformers", "vllm"):
        snippet = lens_tab.code_for(tiny_service, result, "logit", form)
        assert_no_server_path(snippet, tiny_model_dir)
        assert f"MODEL = {tiny_model_dir.name!r}" in snippet and "a folder on the app's server" in snippet
    steered = tiny_service.intervene(InterveneRequest(prompt="The capital of France is", word="Paris", layer="2",
                                                      alphas=(0.0, 1.0)))
    assert_no_server_path(intervene_tab.code_for(tiny_service, steered), tiny_model_dir)
    assert_no_server_path(json.dumps(result.to_json()), tiny_model_dir)         # what the API and downloads carry


def test_api_answers_and_errors_name_no_server_folder(tiny_service, tiny_url, tiny_model_dir, monkeypatch):
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    client = Client(tiny_url, verbose=False)
    answer = client.predict("The capital of France is", "logit", "all", 3, "", api_name="/lens")
    assert answer["model"] == tiny_model_dir.name
    assert_no_server_path(json.dumps(answer), tiny_model_dir)
    with pytest.raises(AppError) as expected:
        client.predict("The capital of France is", "logit", "all", 1000, "", api_name="/lens")
    assert_no_server_path(str(expected.value), tiny_model_dir)

    def fault(*args, **kwargs):
        raise OSError(2, "No such file or directory", str(tiny_model_dir / "secret" / "weights.bin"))

    monkeypatch.setattr(tiny_service, "lens", fault)
    with pytest.raises(AppError) as unexpected:
        client.predict("The capital of France is", "logit", "all", 3, "", api_name="/lens")
    message = str(unexpected.value)
    assert re.search(r"reference [0-9a-f]{8}", message) and "secret" not in message and "OSError" not in message
    assert_no_server_path(message, tiny_model_dir)

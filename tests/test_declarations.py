"""One declaration per request: a field added at the end of a request reaches every surface with no other edit,
and a request is read once, when it is made.

The first test declares a throwaway request kind (a generation with one more field at its end) and finds that
field on the API's endpoint (last, with its help and its parser), on the command line (its flag, read by its
parser), as the last key of a link to a tab of that kind (read back by its parser) and as an input of that
tab, which sends it; the kind's registry entry and the tab's one-line declaration are the only other lines it
adds. The second counts
the field parsers a request goes through: each of its fields once, when it is made, and none after, however
far it travels through the service (a fitted steer's default sweep, too: its fit is a fake's, tests/fakes.py).
A new request kind is one entry in `service/kinds.py` too: a throwaway kind with a request and a result of its
own is a command (in `lensapp --help`, run by `cli.main`, printing its result's text or JSON) and an endpoint of
the served app (gradio_client's API info, and its answer).
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass, replace

import gradio as gr
import pytest
from fakes import FitDeskFake
from tiny_app import served

from lensapp import cli, config
from lensapp.server import make_app
from lensapp.service import fields, kinds, parsers
from lensapp.service.field import Field, RequestError
from lensapp.service.limits import RateLimiter
from lensapp.service.requests import GenerateRequest, InterveneRequest, LensRequest, Request
from lensapp.ui import api, generate_tab, kept, permalinks, views
from lensapp.ui.downloads import Downloads
from lensapp.ui.guard import Guard
from lensapp.ui.kept import value_of

SHOUT = Field("shout", "say it louder", False, parsers.flag("shout"), flag="--shout")


@dataclass(frozen=True)
class ShoutRequest(GenerateRequest):
    shout: bool = SHOUT.declared()


@pytest.fixture
def shout_kind(monkeypatch):
    heard = []

    def run(service, req):
        heard.append(req)
        return _Answer() if service is None else service.generate(req)

    kind = kinds.Kind("shout", ShoutRequest, run, "Generate, louder.", "what generate returns",
                      command=kinds.Command("generate, louder"))
    monkeypatch.setitem(kinds.KINDS, "shout", kind)
    return kind, heard


class _Answer:
    def to_json(self):
        return {"ok": True}


class _Guard:
    def api(self, request, fn, *args):
        return fn(*args)


def test_a_field_added_at_the_end_of_a_request_reaches_every_surface(shout_kind):
    kind, heard = shout_kind
    fn = api.endpoint_function(kind, service=None, guard=_Guard())
    params = list(inspect.signature(fn).parameters)
    assert params[-2:] == ["shout", "request"] and "say it louder" in fn.__doc__
    assert "shout" in {k.name for k in api.endpoints()}
    assert fn(prompt="Hi", shout="yes") == {"ok": True} and heard[-1].shout is True
    with pytest.raises(RequestError, match="shout must be true or false"):
        fn(prompt="Hi", shout="loudly")

    args = cli.build_parser().parse_args(["shout", "Hi", "--shout", "--max-tokens", "3"])
    request = cli.request_of(args)
    assert isinstance(request, ShoutRequest) and request.shout and request.max_tokens == 3


def test_the_field_reaches_a_link_and_a_tab_of_that_kind(shout_kind, tiny_service, monkeypatch):
    _, heard = shout_kind
    view = views.TabView("shout", "shout")                      # the tab's declaration: its kind, nothing else
    monkeypatch.setitem(views.TAB_VIEWS, "shout", view)

    link = permalinks.encode(views.View(tab="shout", prompt="Hi", shout=True))
    assert list(link)[-1] == "shout" and link["shout"] == "1"
    back, notices = permalinks.decode(permalinks.query_string(views.View(tab="shout", shout=True)))
    assert notices == [] and back.tab == "shout" and back.shout is True
    back, notices = permalinks.decode("tab=shout&shout=loudly")
    assert back.shout is False and "shout must be true or false" in notices[0]

    guard = Guard(RateLimiter(0))
    with gr.Blocks() as page:
        parts = generate_tab.build_generate_tab(tiny_service, guard, Downloads(guard), view)
    kept.keep_in(page, kept.KeptResults(1 << 20))
    box = parts.inputs["shout"]
    assert isinstance(box, gr.Checkbox) and box.label == "say it louder" and box.value is False
    assert set(parts.inputs) == set(view.input_names())
    values = view.values_of(views.View(tab="shout", prompt="Hi", max_tokens=1, shout=True))
    assert values["shout"] is True
    out = parts.run(values)
    assert heard[-1].shout is True and heard[-1].max_tokens == 1 and out["text"] == value_of(out["state"]).text
    assert permalinks.decode(permalinks.query_string(view.view_of(values))).view.shout is True


@dataclass(frozen=True)
class CountRequest(Request):
    prompt: str = fields.PROMPT.declared()
    chat: bool = fields.CHAT.declared()


@dataclass
class Counted:
    prompt: str
    tokens: int

    def to_json(self):
        return {"prompt": self.prompt, "tokens": self.tokens}

    def to_text(self):
        return f"{self.prompt!r} is {self.tokens} tokens"


@pytest.fixture
def count_kind(monkeypatch):
    """A kind nothing else names: its request, its result and this entry are all it has."""
    kind = kinds.Kind("count", CountRequest,
                      lambda service, req: Counted(req.prompt, len(service.prompts.ids(req.prompt, req.chat))),
                      "Count a prompt's tokens.", "{prompt, tokens}", command=kinds.Command("count a prompt's tokens"))
    monkeypatch.setitem(kinds.KINDS, "count", kind)
    return kind


def test_a_new_kind_is_a_command_and_an_endpoint(count_kind, tiny_service, tiny_model_dir, capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "count a prompt's tokens" in capsys.readouterr().out
    model = ["--model", str(tiny_model_dir), "--backend", "transformers", "--jlens", "none"]
    tokens = len(tiny_service.prompts.ids("Water boils at"))
    assert cli.main(["count", "Water boils at", *model]) == 0
    assert capsys.readouterr().out == f"'Water boils at' is {tokens} tokens\n"
    assert cli.main(["count", "Water boils at", "--json", *model]) == 0
    assert json.loads(capsys.readouterr().out) == {"prompt": "Water boils at", "tokens": tokens}
    assert cli.main(["count", "", *model]) == cli.EXIT_USAGE              # its field's parser: one line
    assert capsys.readouterr().err.startswith("error: ")

    from gradio_client import Client

    with served(make_app(tiny_service, config.Config.of(rate_limit=0))) as url:
        client = Client(url, verbose=False)
        endpoint = client.view_api(print_info=False, return_format="dict")["named_endpoints"]["/count"]
        assert [p["parameter_name"] for p in endpoint["parameters"]] == ["prompt", "chat"]
        assert client.predict("Water boils at", api_name="/count") == {"prompt": "Water boils at", "tokens": tokens}


@pytest.fixture
def counted(monkeypatch):
    calls = []
    real = Field.__call__

    def counting(self, raw):
        calls.append(self.name)
        return real(self, raw)

    monkeypatch.setattr(Field, "__call__", counting)
    return calls


@pytest.mark.parametrize("make, run", [
    (lambda: LensRequest.parse(prompts=["The capital of France is"], layers="0,2", k="3", targets="Paris"),
     lambda service, req: service.lens(req)),
    (lambda: GenerateRequest.parse(prompt="Once upon", max_tokens="2", layers="-1"),
     lambda service, req: service.generate(req)),
    (lambda: InterveneRequest.parse(prompt="The capital of France is", intervention="steer", word="Rome", layer="1",
                                    alphas="0,1", new_tokens="2"),
     lambda service, req: service.intervene(req)),
    (lambda: InterveneRequest.parse(prompt="The capital of France is", intervention="patch",
                                    source="The capital of Italy is", layer="0-1"),
     lambda service, req: service.intervene(req)),
    (lambda: InterveneRequest.parse(prompt="The capital of France is", intervention="steer", word="Rome", layer="1",
                                    direction="fitted", positions="-1"),
     lambda service, req: service.intervener.run(req, replace(service.intervention_inputs(),
                                                              fits=FitDeskFake(service.info.d_model)))),
], ids=["lens", "generate", "steer", "patch", "fitted steer"])
def test_a_request_is_read_once_when_it_is_made(tiny_service, counted, make, run):
    request = make()
    assert sorted(counted) == sorted(f.name for f in type(request).__dataclass_fields__.values())
    counted.clear()
    run(tiny_service, request)
    assert counted == [], f"read again downstream: {counted}"

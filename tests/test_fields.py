"""The request schema (service/fields.py) and every surface bound to it: the request classes, the API's
endpoints, the CLI's flags, the permalink codec and the tabs.

Each field's own examples must parse to their values and its hostile values must be refused in one
line; each surface must carry the schema's fields (the same parser, not a copy); and the same hostile
value must get the same answer from a link, the API and the command line."""

from __future__ import annotations

import inspect
from dataclasses import fields as dataclass_fields

import gradio as gr
import pytest
from field_cases import CASES as FIELD_CASES
from hostile import assert_one_line, run_cli

from lensapp import config
from lensapp.service import fields as f
from lensapp.service.field import Field, RequestError, fields_of
from lensapp.service.requests import (
    ChatRequest,
    DescribeRequest,
    EvaluateRequest,
    GenerateRequest,
    InterveneRequest,
    LensRequest,
)
from lensapp.ui import api, permalinks, views
from lensapp.ui.permalinks import View, as_text

SCHEMA = {name: value for name, value in vars(f).items() if isinstance(value, Field)}
EXAMPLES = {name: FIELD_CASES.get(name, ((), ())) for name in SCHEMA}
for _alias, _base in (("CHAT_MAX_TOKENS", "MAX_TOKENS"), ("CHAT_K", "K"),      # a field made from another
                      ("INTERVENE_SEED", "SEED")):
    EXAMPLES[_alias] = (tuple(x for x in FIELD_CASES[_base][0] if x[1] != SCHEMA[_base].default), FIELD_CASES[_base][1])
REQUESTS = (LensRequest, GenerateRequest, ChatRequest, InterveneRequest, DescribeRequest, EvaluateRequest)
# The API's published parameter order: a parameter is only ever added at the end (old clients keep working).
PUBLISHED = {
    "lens": ["prompt", "lens", "layers", "k", "targets", "chat", "raw", "skip_punctuation"],
    "compare": ["prompts", "lens", "layers", "k", "targets", "chat", "raw", "skip_punctuation"],
    "generate": ["prompt", "max_tokens", "lens", "layers", "k", "temperature", "seed", "chat", "raw"],
    "chat": ["messages", "lens", "layer", "max_tokens", "temperature", "k", "seed"],
    "intervene": ["prompt", "intervention", "word", "layer", "alphas", "direction", "from_word", "objective",
                  "positions", "prompt_only", "ablation", "reference", "source", "source_positions", "lens", "layers",
                  "k", "targets", "new_tokens", "temperature", "seed", "chat", "raw"],
    "components": ["prompt", "target", "foil", "position", "patterns", "chat"],
    "describe": ["prompt", "layer", "position", "max_tokens", "inspect", "inspect_layer", "chat"],
    "evaluate": ["items", "split"],
}


def schema_field(field: Field) -> Field:
    """The schema's declaration `field` is, or is made from (a view may change only the default, and a link
    may call it by a short name: permalinks.SHORT_NAMES)."""
    for declared in SCHEMA.values():
        if declared is field:
            return declared
    name = permalinks.SHORT_NAMES.get(field.name, field.name)
    for declared in SCHEMA.values():
        if declared.name == name and declared.parse is field.parse:
            return declared
    raise AssertionError(f"{field.name} is not a field of service/fields.py")


@pytest.mark.parametrize("name", sorted(SCHEMA))
def test_every_field_reads_its_examples_and_refuses_its_hostile_values(name):
    field = SCHEMA[name]
    examples, hostile = EXAMPLES[name]
    assert field.help and (examples or field.default is None)
    for raw, value in examples:
        assert field(raw) == value, (raw, value)
    assert hostile, f"{name} has no hostile values in tests/field_cases.py"
    for raw in hostile:
        with pytest.raises(RequestError) as e:
            field(raw)
        assert_one_line(str(e.value))


@pytest.mark.parametrize("cls", REQUESTS, ids=lambda c: c.__name__)
def test_every_request_field_is_declared_in_the_schema(cls):
    declared = fields_of(cls)
    assert list(declared) == [x.name for x in dataclass_fields(cls)]
    for x in dataclass_fields(cls):
        field = declared[x.name]
        assert schema_field(field) is field
        assert (x.default_factory() if callable(x.default_factory) else x.default) == field.default


def test_a_link_reads_each_request_field_with_its_parser():
    for name, field in permalinks.view_fields().items():
        if name in ("tab", "metric", "start", "title", "note", "branches"):  # what only a view has
            assert field is getattr(permalinks, name.upper())
            continue
        assert schema_field(field).parse is field.parse, name
        if name not in views.EXAMPLES:  # the page opens on an example
            assert getattr(View(), name) == schema_field(field).default, name


def test_the_api_is_made_from_the_schema():
    assert [e.name for e in api.endpoints()] == list(PUBLISHED)
    for endpoint in api.endpoints():
        names = [field.name for field in endpoint.fields()]
        assert names[:len(PUBLISHED[endpoint.name])] == PUBLISHED[endpoint.name], endpoint.name
        fn = api.endpoint_function(endpoint, service=None, guard=None)
        params = list(inspect.signature(fn).parameters.values())
        assert [p.name for p in params] == names + ["request"]
        for p, field in zip(params, endpoint.fields()):
            assert schema_field(field) is field
            assert (p.annotation, p.default) == api.api_form(field)
            assert field.help in fn.__doc__
            if p.default is not inspect.Parameter.empty and not field.required:
                assert field(p.default) == field.default          # the API's default means the field's


def test_the_cli_is_made_from_the_schema():
    from lensapp import cli

    parser = cli.build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    for command, kind in cli.commands().items():
        actions = {a.dest: a for a in commands[command]._actions}
        for field in fields_of(kind.request).values():
            assert schema_field(field) is field
            if field.selects:
                for value, (flag, _) in field.selects.items():
                    assert actions[f"select_{value}"].option_strings == [flag]
                continue
            if not field.cli:
                assert field.name not in actions
                continue
            action = actions[field.name]
            assert action.option_strings == ([field.flag] if field.flag else []), field.name
            assert action.default is None                          # unset: the field's own default applies


@pytest.fixture(scope="module")
def tiny_app(tiny_service):
    from lensapp import ui

    return tiny_service, ui.build_ui(tiny_service, config.WebSettings(), config.LimitSettings(rate_limit=0))


def test_the_tabs_open_on_the_schemas_defaults(tiny_app):
    _, built = tiny_app
    assert list(built.tabs) == list(permalinks.TABS) == list(permalinks.TAB_VIEWS)
    for name, parts in built.tabs.items():
        assert set(parts.inputs) == set(parts.view.input_names()), name      # every field the link carries
        view = View(tab=name)
        for component, value in parts.values(view).items():
            assert component.value == (value if not isinstance(value, tuple) else as_text(value)), (name, component)


# -- one hostile value, three doors -----------------------------------------------------------------------

# (field, the CLI command and flag that carry it, the API endpoint and parameter); booleans are flags without
# a value on the command line, so only links and the API can send them something hostile.
DOORS = [(f.K, "--k", "lens"), (f.LAYERS, "--layers", "lens"), (f.LENS, "--lens", "lens"),
         (f.TARGETS, "--target", "lens"), (f.MAX_TOKENS, "--max-tokens", "generate"),
         (f.TEMPERATURE, "--temperature", "generate"), (f.SEED, "--seed", "generate"), (f.PROMPT, None, "generate"),
         (f.CHAT, None, "lens"), (f.RAW, None, "generate"), (f.SPAN, "--layer", "intervene"),
         (f.ALPHAS, "--alpha", "intervene"), (f.POSITIONS, "--position", "intervene"),
         (f.DIRECTION, "--direction", "intervene"), (f.ABLATION, "--ablation", "intervene"),
         (f.NEW_TOKENS, "--max-tokens", "intervene"), (f.FROM_WORD, "--from", "intervene")]
CASES = [(field, flag, endpoint, raw) for field, flag, endpoint in DOORS
         for raw in EXAMPLES[next(n for n, x in SCHEMA.items() if x is field)][1] if isinstance(raw, str)]


@pytest.mark.parametrize("field, flag, endpoint, raw", CASES,
                         ids=[f"{c[0].name}-{i}" for i, c in enumerate(CASES)])
def test_a_hostile_value_gets_the_same_answer_at_every_door(tiny_app, field, flag, endpoint, raw):
    from lensapp.service.limits import RateLimiter
    from lensapp.ui.guard import Guard

    with pytest.raises(RequestError) as e:
        field(raw)
    message = str(e.value)

    view, notices = permalinks.decode({"tab": endpoint if endpoint == "intervene" else "generate", field.name: raw})
    assert getattr(view, field.name) == getattr(View(), field.name)
    assert len(notices) == 1 and message in notices[0], notices

    service, _ = tiny_app
    call = api.endpoint_function(next(x for x in api.endpoints() if x.name == endpoint), service,
                                 Guard(RateLimiter(0)))
    args = {"prompt": "Hi", **({"word": "Rome", "layer": "3"} if endpoint == "intervene" else {}), field.name: raw}
    with pytest.raises(gr.Error) as e:
        answer = call(**args)
        if inspect.isgenerator(answer):          # a streaming endpoint refuses at its first frame
            next(answer)
    assert e.value.message == message

    if flag is not None or field is f.PROMPT:
        command = endpoint if endpoint != "chat" else "generate"
        argv = [command, raw, "--jlens", "none"] if field is f.PROMPT else [command, "Hi", flag, raw]
        if command == "intervene":
            argv[2:2] = ["--steer", "Rome"] + (["--layer", "3"] if field is not f.SPAN else [])
        code, out, err = run_cli(argv)
        assert (code, out, err) == (2, "", f"error: {message}\n")

"""/components and /lens with sublayers through gradio_client against the running app, against the CLI's JSON for
the same request run on a second engine of the same model (test_api.py's way). The patterns' keys are layer
numbers as text: Gradio sends answers through orjson, which refuses integer keys."""

from __future__ import annotations

import json

import pytest
from test_api import assert_same, client, service  # noqa: F401 - fixtures

from lensapp import cli
from lensapp.results import dumps

pytestmark = pytest.mark.engine

FRANCE = "The capital of France is"


def cli_json(service, argv):  # noqa: F811 - the fixture imported above
    args = cli.build_parser().parse_args([*argv, "--json"])
    request = cli.request_of(args)
    if args.command == "components":
        return json.loads(dumps(service.components(request)))
    return json.loads(dumps(service.lens(request, cli.MAX_CLI_PROMPTS)[0]))


def test_components_answer_through_the_api_what_the_cli_prints(client, service):  # noqa: F811
    api = client.predict(FRANCE, "Paris", "Rome", -1, 23, api_name="/components")
    assert_same(api, cli_json(service, ["components", FRANCE, "--target", "Paris", "--foil", "Rome",
                                        "--patterns", "23"]))
    assert list(api["patterns"]) == ["23"] and len(api["patterns"]["23"]) == 9
    assert api["logit"] == pytest.approx(api["sum"], rel=1e-4)
    plain = client.predict(prompt=FRANCE, target="Paris", api_name="/components")
    assert "patterns" not in plain and plain["foil"] is None and plain["position"] == 4


def test_a_bad_components_request_is_one_line(client):  # noqa: F811
    from gradio_client.exceptions import AppError

    for params, words in (({"target": ""}, "target is empty"), ({"target": "Paris", "position": 99}, "outside"),
                          ({"target": "Paris", "patterns": "all"}, "whole number")):
        with pytest.raises(AppError, match=words) as e:
            client.predict(prompt=FRANCE, **params, api_name="/components")
        assert "\n" not in str(e.value).strip()


def test_the_lens_with_sublayers_answers_what_the_cli_prints(client, service):  # noqa: F811
    api = client.predict(prompt=FRANCE, layers="20,24", k=3, sublayers=True, api_name="/lens")
    assert_same(api, cli_json(service, ["lens", FRANCE, "--layers", "20,24", "--k", "3", "--sublayers"]))
    assert set(api["after_attention"]) == {"logit"} and len(api["after_attention"]["logit"]["top_tokens"]) == 2

"""Every API endpoint, through gradio_client against the running app, answers what the command line prints.

Gradio serializes an answer with orjson, which refuses what Python's json takes (a dict with integer keys:
every steer's answer was once lost that way, the client hearing a bare CancelledError). So each endpoint,
and each intervention kind and direction with and without a generation, is called here over HTTP, and its
answer compared with the CLI's `--json` for the same request: the command line parsed by the CLI's own
parser (`cli.request_of`) and run on a second vLLM service of the same model and lens, here in the test
process. Two engines of one model agree to float noise: floats are compared to 1e-4, everything else
exactly.
"""

from __future__ import annotations

import json
import math

import pytest
from conftest import APP_JLENS

from lensapp import cli
from lensapp.results import dumps
from lensapp.service import ChatRequest

pytestmark = pytest.mark.engine

FRANCE, EIFFEL, COLOSSEUM = ("The capital of France is", "The Eiffel Tower is in the city of",
                             "The Colosseum is in the city of")
READ = {"lens": "both", "layers": "20,24,28", "k": 3}
READ_ARGS = ["--lens", "both", "--layers", "20,24,28", "--k", "3"]

# (API parameters, the same request as a command line)
INTERVENTIONS = {
    "steer logit": ({"intervention": "steer", "word": "Rome", "layer": "22", "alphas": "0,0.4"},
                    ["--steer", "Rome", "--layer", "22", "--alpha", "0,0.4"]),
    "steer jacobian": ({"intervention": "steer", "word": "Rome", "layer": "20", "alphas": "0.4",
                        "direction": "jacobian"}, ["--steer", "Rome", "--layer", "20", "--alpha", "0.4",
                                                   "--direction", "jacobian"]),
    "steer difference": ({"intervention": "steer", "word": "Rome", "from_word": "Paris", "layer": "22",
                          "alphas": "0.4"}, ["--steer", "Rome", "--from", "Paris", "--layer", "22", "--alpha", "0.4"]),
    "steer fitted": ({"intervention": "steer", "word": "Rome", "layer": "20", "alphas": "0,1",
                      "direction": "fitted", "objective": "lens"},
                     ["--steer", "Rome", "--layer", "20", "--alpha", "0,1", "--direction", "fitted",
                      "--objective", "lens"]),
    "steer and generate": ({"intervention": "steer", "word": "Rome", "layer": "22", "alphas": "0.4",
                            "new_tokens": 3},
                           ["--steer", "Rome", "--layer", "22", "--alpha", "0.4", "--max-tokens", "3"]),
    "ablate project": ({"intervention": "ablate", "word": "Paris", "layer": "20,24", "direction": "jacobian"},
                       ["--ablate", "Paris", "--layer", "20,24", "--direction", "jacobian"]),
    "ablate mean": ({"intervention": "ablate", "word": "Paris", "layer": "22", "ablation": "mean",
                     "new_tokens": 2},
                    ["--ablate", "Paris", "--layer", "22", "--ablation", "mean", "--max-tokens", "2"]),
    "patch": ({"intervention": "patch", "source": EIFFEL, "layer": "4-5", "positions": "1-3", "targets": "Paris"},
              ["--patch-from", EIFFEL, "--layer", "4-5", "--position", "1-3", "--target", "Paris"]),
}


@pytest.fixture(scope="module")
def client(app_url):
    from gradio_client import Client

    return Client(app_url, verbose=False)


@pytest.fixture(scope="module")
def service(vllm_service, app_url):
    """A second engine of the app's model, reading the app's own Jacobian lens: what the CLI would run."""
    vllm_service.load_jlens(str(APP_JLENS[0]))
    yield vllm_service
    vllm_service.install_jlens(None)


def cli_json(service, argv: list[str]):
    """What `lensapp <argv> --json` prints, run on `service` (the CLI's parser, request and output path)."""
    args = cli.build_parser().parse_args([*argv, "--json"])
    request = cli.request_of(args)
    if args.command == "lens":
        results = service.lens(request, cli.MAX_CLI_PROMPTS)
        return json.loads(dumps(results[0] if len(results) == 1 else results))
    run = {"intervene": service.intervene, "components": service.components, "describe": service.describe}
    return json.loads(dumps(run.get(args.command, service.generate)(request)))


def assert_same(api, expected, where="answer"):
    """Equal JSON, floats to 1e-4 (two engines' float noise, after the five significant digits JSON keeps)."""
    if isinstance(expected, dict):
        assert isinstance(api, dict) and set(api) == set(expected), f"{where}: keys {set(api) ^ set(expected)}"
        for key in expected:
            assert_same(api[key], expected[key], f"{where}.{key}")
    elif isinstance(expected, list):
        assert isinstance(api, list) and len(api) == len(expected), f"{where}: lengths differ"
        for i, (a, e) in enumerate(zip(api, expected)):
            assert_same(a, e, f"{where}[{i}]")
    elif isinstance(expected, float) and not isinstance(expected, bool):
        assert isinstance(api, (int, float)) and math.isclose(api, expected, rel_tol=1e-4, abs_tol=1e-4), \
            f"{where}: {api} != {expected}"
    else:
        assert api == expected, f"{where}: {api!r} != {expected!r}"


def test_lens_compare_and_generate_answer_what_the_cli_prints(client, service):
    api = client.predict(FRANCE, "both", "20,24,28", 3, "Paris", api_name="/lens")
    assert_same(api, cli_json(service, ["lens", FRANCE, "--target", "Paris", *READ_ARGS]))
    api = client.predict([FRANCE, EIFFEL], "both", "20,24,28", 3, "", api_name="/compare")
    assert_same(api, cli_json(service, ["lens", FRANCE, EIFFEL, *READ_ARGS]))
    api = client.predict(FRANCE, 4, "both", "20,24,28", 3, 0.0, None, api_name="/generate")
    assert_same(api, cli_json(service, ["generate", FRANCE, "--max-tokens", "4", *READ_ARGS]))


def test_chat_answers_what_the_service_reads(client, service):
    """The chat has no command line: its answer is compared with the service's own JSON."""
    messages = [{"role": "user", "content": "Name a fruit."}]
    for lens, layer in (("logit", 20), ("jacobian", -1)):
        api = client.predict(messages, lens, layer, 4, 0.0, 3, api_name="/chat")
        expected = service.chat(ChatRequest.parse(messages=messages, lens=lens, layer=layer, max_tokens=4, k=3))
        assert_same(api, json.loads(json.dumps(expected.to_json())))


@pytest.mark.parametrize("kind", list(INTERVENTIONS))
def test_every_intervention_answers_through_the_api_what_the_cli_prints(client, service, kind):
    params, argv = INTERVENTIONS[kind]
    api = client.predict(prompt=FRANCE, **READ, **params, api_name="/intervene")
    assert_same(api, cli_json(service, ["intervene", FRANCE, *argv, *READ_ARGS]))
    assert set(api) >= {"before", "after", "labels", "intervention"}


def test_components_answer_through_the_api_what_the_cli_prints(client, service):
    """The patterns' keys are layer numbers as text: orjson refuses integer keys."""
    api = client.predict(FRANCE, "Paris", "Rome", -1, 23, api_name="/components")
    assert_same(api, cli_json(service, ["components", FRANCE, "--target", "Paris", "--foil", "Rome",
                                        "--patterns", "23"]))
    assert list(api["patterns"]) == ["23"] and len(api["patterns"]["23"]) == 9
    assert api["logit"] == pytest.approx(api["sum"], rel=1e-4)
    plain = client.predict(prompt=FRANCE, target="Paris", api_name="/components")
    assert "patterns" not in plain and plain["foil"] is None and plain["position"] == 4


def test_a_bad_components_request_is_one_line(client):
    from gradio_client.exceptions import AppError

    for params, words in (({"target": ""}, "target is empty"), ({"target": "Paris", "position": 99}, "outside"),
                          ({"target": "Paris", "patterns": "all"}, "whole number")):
        with pytest.raises(AppError, match=words) as e:
            client.predict(prompt=FRANCE, **params, api_name="/components")
        assert "\n" not in str(e.value).strip()


def test_the_lens_with_sublayers_answers_what_the_cli_prints(client, service):
    api = client.predict(prompt=FRANCE, layers="20,24", k=3, sublayers=True, api_name="/lens")
    assert_same(api, cli_json(service, ["lens", FRANCE, "--layers", "20,24", "--k", "3", "--sublayers"]))
    assert set(api["after_attention"]) == {"logit"} and len(api["after_attention"]["logit"]["top_tokens"]) == 2


def test_a_branch_and_a_description_answer_what_the_cli_prints(client, service):
    """issue 28: /generate's last parameter forces tokens (a branch of a branch here), /describe describes a cell,
    and a layer range of them is a list; the lens JSON's decided_at arrives with its nulls."""
    api = client.predict(FRANCE, 5, "logit", "20,24,28", 3, 0.0, None, False, False, ["1= Rome", "3=#30"],
                         api_name="/generate")
    assert api["forced"][0]["step"] == 1 and [f["token_id"] for f in api["forced"]][1] == 30
    assert_same(api, cli_json(service, ["generate", FRANCE, "--max-tokens", "5", "--layers", "20,24,28", "--k", "3",
                                        "--force", "1= Rome", "--force", "3=#30"]))
    api = client.predict(EIFFEL, "12", 4, 3, api_name="/describe")
    assert isinstance(api, dict) and api["layer"] == 12 and api["position"] == 4
    assert_same(api, cli_json(service, ["describe", EIFFEL, "--layer", "12", "--position", "4", "--max-tokens", "3"]))
    api = client.predict(EIFFEL, "10-12", -1, 2, "x -> x; ?", None, api_name="/describe")
    assert [d["layer"] for d in api] == [10, 11, 12] and all(d["inspection_prompt"] == "x -> x; ?" for d in api)
    assert_same(api, cli_json(service, ["describe", EIFFEL, "--layer", "10-12", "--max-tokens", "2", "--inspect",
                                        "x -> x; ?"]))
    lens = client.predict(FRANCE, "logit", "0,1,2", 3, "", api_name="/lens")["lenses"]["logit"]
    assert len(lens["decided_at"]) == len(lens["top_ids"][0]) and None in lens["decided_at"]


def test_the_rest_route_answers_the_same_json(client, app_url):
    """Gradio's REST route (`/gradio_api/call/<name>`, the "Use via API" page's curl) writes answers with the
    standard library's json, which cannot embed the queue's ready-made JSON (ui/api.py): it gets the dict,
    and both routes answer the same."""
    import httpx

    from lensapp.service.kinds import KINDS
    from lensapp.ui import api

    given = {"prompt": FRANCE, "lens": "logit", "layers": "20,24", "k": 3, "targets": "Paris"}
    args = [given.get(field.name, api.api_form(field)[1]) for field in KINDS["lens"].fields()]   # REST: every one
    with httpx.Client(base_url=app_url, timeout=120) as http:
        event = http.post("gradio_api/call/lens", json={"data": args}).json()["event_id"]
        stream = http.get(f"gradio_api/call/lens/{event}").text
    lines = stream.splitlines()
    assert "event: complete" in lines, stream[:300]
    data = lines[lines.index("event: complete") + 1]
    rest = json.loads(data.removeprefix("data:"))[0]
    assert_same(rest, client.predict(**given, api_name="/lens"))


def test_a_request_answered_again_is_the_same_answer(client):
    """The second answer of the same request comes from the result cache with its JSON made once
    (ui/answer_memo.py): through gradio_client, the same answer."""
    given = {"prompt": "Water boils at", "lens": "logit", "layers": "all", "k": 4, "targets": "100"}
    assert client.predict(**given, api_name="/lens") == client.predict(**given, api_name="/lens")

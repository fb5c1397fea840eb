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
    result = service.intervene(request) if args.command == "intervene" else service.generate(request)
    return json.loads(dumps(result))


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

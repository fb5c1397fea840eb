"""Every result's JSON is what the API can send: orjson (Gradio's serializer) takes it (string keys only) and it is
strict JSON (no NaN or Infinity, which Python's json writes and no JSON reader takes). Run on the tiny model for
every request kind and intervention kind, so a fast test catches what only the app's API would lose."""

from __future__ import annotations

import json

import orjson
import pytest

from lensapp.service import ChatRequest, GenerateRequest, InterveneRequest, LensRequest

FRANCE = "The capital of France is"
ASKS = {
    "lens": lambda s: s.lens(LensRequest(prompts=(FRANCE,), lens="both", targets=("Paris", "the city"))),
    "compare": lambda s: s.compare(LensRequest(prompts=(FRANCE, "The capital of Italy is"), k=2)),
    "generate": lambda s: s.generate(GenerateRequest(prompt=FRANCE, max_tokens=2, lens="both")),
    "chat": lambda s: s.chat(ChatRequest(messages=({"role": "user", "content": "Hi"},), lens="logit", max_tokens=2)),
    "steer": lambda s: s.intervene(InterveneRequest(prompt=FRANCE, intervention="steer", word="Rome", layer="1-2",
                                                    alphas=(0.0, 0.5), new_tokens=2, targets=("Paris",))),
    "ablate": lambda s: s.intervene(InterveneRequest(prompt=FRANCE, intervention="ablate", word="Paris", layer="1",
                                                     ablation="mean")),
    "patch": lambda s: s.intervene(InterveneRequest(prompt=FRANCE, intervention="patch",
                                                    source="The capital of Italy is", layer="0-1")),
}


def strict(value):
    raise ValueError(f"{value} is not JSON")


@pytest.mark.parametrize("kind", list(ASKS))
def test_every_answer_is_json_the_api_can_send(tiny_service, kind):
    result = ASKS[kind](tiny_service)
    for r in result if isinstance(result, list) else [result]:
        answer = r.to_json()
        orjson.dumps(answer)                                       # raises on a non-string key
        text = json.dumps(answer, allow_nan=False)                 # raises on NaN or Infinity
        assert json.loads(text, parse_constant=strict) == json.loads(orjson.dumps(answer))

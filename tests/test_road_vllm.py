"""The road not taken, on vLLM with the embedded model: a branch continues as its prefix would, the decision
strip is what the full lens grid says (both lenses), and Patchscopes says what plain transformers says."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from patchscope_reference import describe as reference
from patchscope_reference import load

from lensapp import config
from lensapp.engine.run.protocol import Sampling
from lensapp.results import GenerationResult, dumps
from lensapp.service import DescribeRequest, GenerateRequest, LensRequest
from lensapp.service.describing import IDENTITY_PROMPT
from lensapp.service.selection import Selection

pytestmark = pytest.mark.engine

PROMPT = "The capital of France is"


def direct(service, prompt_ids: list[int], n: int, temperature: float, seed) -> GenerationResult:
    """The generation of `prompt_ids` itself, straight from the engine (every position read, nothing reused)."""
    plan = service.generator.plan(GenerateRequest(prompt=PROMPT, max_tokens=1, k=5))
    spec = dataclasses.replace(plan.specs[0], input_ids=tuple(prompt_ids))
    out = service.engine.generate(spec, Sampling(n, temperature, seed))
    return GenerationResult.from_output(out, prompt=PROMPT, ids=prompt_ids, layers=plan.layers,
                                        decode=service.prompts.decode, text="", k=5)


@pytest.mark.parametrize("temperature, seed", [pytest.param(0.0, None, marks=pytest.mark.extended), (0.9, 11)])
def test_a_branch_continues_as_its_prefix_would(vllm_service, temperature, seed):
    req = GenerateRequest(prompt=PROMPT, max_tokens=8, temperature=temperature, seed=seed, k=5)
    trunk = vllm_service.generate(req)
    branch = vllm_service.generate(dataclasses.replace(req, force=((2, " Rome"),)))
    ids = vllm_service.prompts.ids(PROMPT)
    rome = vllm_service.prompts.forced(" Rome", ids + trunk.token_ids[:2], vllm_service.info.vocab_size)
    alone = direct(vllm_service, ids + trunk.token_ids[:2] + [rome], 5, temperature, seed)
    assert branch.token_ids == trunk.token_ids[:2] + [rome] + alone.token_ids
    for s in range(3):                                           # the prefix's readouts: the trunk's, reused
        assert branch.steps[s].readout.lenses["logit"].top_ids.tolist() == \
            trunk.steps[s].readout.lenses["logit"].top_ids.tolist()
    for s, step in enumerate(alone.steps):                      # the rest: the direct generation's
        got, want = branch.steps[3 + s].readout.lenses["logit"], step.readout.lenses["logit"]
        np.testing.assert_array_equal(got.top_ids[:, -1, 0], want.top_ids[:, -1, 0])
        np.testing.assert_allclose(got.top_probs[:, -1], want.top_probs[:, -1], rtol=1e-3, atol=1e-5)
    # forcing what the greedy trunk said anyway changes nothing
    if temperature == 0.0:
        same = vllm_service.generate(dataclasses.replace(req, force=((2, f"#{trunk.token_ids[2]}"),)))
        assert same.token_ids == trunk.token_ids


def recomputed(grid_ids: list, grid_probs: list, tokens: list[int], layers: list[int]) -> list[int | None]:
    """decided_at by its definition, from a grid as the JSON carries it ([layer][position][k])."""
    out = []
    for p, t in enumerate(tokens):
        first = None
        for i in reversed(range(len(layers))):
            ids, probs = grid_ids[i][p], grid_probs[i][p]
            if not (t in ids and probs[ids.index(t)] >= probs[0]):
                break
            first = layers[i]
        out.append(first)
    return out


@pytest.fixture(scope="module")
def shipped_lens(vllm_service):
    vllm_service.load_jlens(str(config.SHIPPED_JLENS))
    yield vllm_service
    vllm_service.install_jlens(None)


def test_the_decision_strip_is_the_full_grids(shipped_lens):
    service = shipped_lens
    prompt = "Rivers flow downhill until they reach the"
    lens = json.loads(dumps(service.lens(LensRequest(prompts=(prompt,), lens="both", k=10))[0]))
    for name, r in lens["lenses"].items():
        finals = [r["top_ids"][-1][p][0] for p in range(len(lens["input_ids"]))]
        assert r["decided_at"] == recomputed(r["top_ids"], r["top_probs"], finals, lens["layers"]), name
        assert r["decided_tokens"] == [r["top_tokens"][-1][p][0] for p in range(len(finals))]
    assert lens["lenses"]["jacobian"]["decided_at"] != lens["lenses"]["logit"]["decided_at"]
    gen = json.loads(dumps(service.generate(GenerateRequest(prompt=prompt, max_tokens=4, lens="both", k=10))))
    for name in ("logit", "jacobian"):
        steps = [s["lenses"][name] for s in gen["steps"]]
        want = [recomputed([layer[-1:] for layer in r["top_ids"]], [layer[-1:] for layer in r["top_probs"]],
                           [token], gen["steps"][0]["layers"])[0] for r, token in zip(steps, gen["token_ids"])]
        assert gen["decided_at"][name] == want, name


# Three cells of prompts found nowhere else in the docs or tests; CI checks the first (the rest: `extended`).
CELLS = [("My grandmother baked an apple pie for", 8, 6), ("Water boils when the kettle gets", 14, 5),
         ("The orchestra tuned their violins before the", 20, 7)]


@pytest.mark.parametrize("cells", [pytest.param(CELLS[:1], id="one"),
                                   pytest.param(CELLS, id="three", marks=pytest.mark.extended)])
def test_patchscopes_says_what_plain_transformers_says(vllm_service, embedded_dir, cells):
    model = load(embedded_dir)
    inspect_ids = vllm_service.prompts.ids(IDENTITY_PROMPT)
    for prompt, layer, position in cells:
        got = vllm_service.describe(DescribeRequest(prompt=prompt, layer=str(layer), position=position, max_tokens=8))
        ids = vllm_service.prompts.ids(prompt)
        want = reference(model, ids, layer, position, inspect_ids, layer, 8)
        assert got.items[0].token_ids == want, (prompt, layer, got.items[0].text,
                                                vllm_service.prompts.text(want))


@pytest.mark.parametrize("layers, alone", [pytest.param("24-29", (26,), id="six"),
                                           pytest.param("all", (3, 17, 29), id="all", marks=pytest.mark.extended)])
def test_a_sweep_over_layers_is_one_request_of_parts_in_flight_together(vllm_service, layers, alone):
    prompt = "A lighthouse keeper lit the lamp at"
    before = vllm_service.engine.health()
    sweep = vllm_service.describe(DescribeRequest(prompt=prompt, layer=layers, position=2, max_tokens=3))
    after = vllm_service.engine.health()
    want = Selection(layers).resolve(vllm_service.info.n_layers)
    assert [d.layer for d in sweep.items] == want
    assert after["forwards"]["generate"] - before["forwards"].get("generate", 0) == len(want)
    assert after["calls"]["served"] - before["calls"]["served"] == 2         # the prompt's read, then the sweep
    for layer in alone:                                                       # batched, as if alone
        one = vllm_service.describe(DescribeRequest(prompt=prompt, layer=str(layer), position=2, max_tokens=3))
        assert one.items[0].token_ids == sweep.items[want.index(layer)].token_ids

"""`fitting.steering` on the transformers backend: the fit reaches its objective within its bounds on the
embedded model, the same inputs give the same vector, and every bound stops it. (Its effect on vLLM:
tests/test_edits_vllm.py.)"""

from __future__ import annotations

import pytest
import torch

from lensapp.engine.run.families import detect, find
from lensapp.engine.run.hf_backend import load_transformers_model
from lensapp.fitting import FitError
from lensapp.fitting.steering import SteerConfig, fit_steering

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def model(embedded_dir):
    m = load_transformers_model(str(embedded_dir), device="cpu", dtype=torch.float32)
    ids = m.tokenizer(PROMPT)["input_ids"]
    rome = m.tokenizer(" Rome", add_special_tokens=False)["input_ids"][0]
    return m, detect(m._module.config).hf, ids, rome


def p_with(m, layout, ids, layer, v, rows, target, lens: bool) -> float:
    """p(target) at the last position with v added at `rows` of block `layer` by a plain torch hook."""
    module = m._module
    block = find(module, layout.blocks)[layer]

    def hook(mod, args, out):
        out = out.clone()
        out[0, rows] += v
        return out

    handle = block.register_forward_hook(hook)
    try:
        with torch.no_grad():
            out = module(torch.tensor([ids]), output_hidden_states=True)
    finally:
        handle.remove()
    logits = module.lm_head(module.model.norm(out.hidden_states[layer + 1][0, -1])) if lens else out.logits[0, -1]
    return float(logits.softmax(-1)[target])


@pytest.mark.parametrize("objective, positions", [("lens", "last"), ("output", (2,)),
                                                  pytest.param("output", "last", marks=pytest.mark.extended),
                                                  pytest.param("output", "all", marks=pytest.mark.extended)])
def test_the_fit_reaches_its_objective_and_the_vector_does_what_it_says(model, objective, positions):
    m, layout, ids, rome = model
    cfg = SteerConfig(objective=objective, positions=positions, max_steps=60)
    seen = []
    fit = fit_steering(m, layout, ids, 20, rome, cfg, progress=lambda *a: seen.append(a))
    assert fit.reached and fit.stopped == "reached" and fit.steps <= 60 and fit.p >= 0.5
    assert [s for s, _, _ in seen] == list(range(fit.steps + 1)) and seen[0][2] == 0.0
    assert fit.vector.shape == (576,) and fit.vector.dtype == torch.float32
    assert 0 < fit.norm < fit.typical_norm            # small next to the stream it steers
    rows = {"last": [len(ids) - 1], "all": list(range(len(ids)))}.get(positions, positions)
    got = p_with(m, layout, ids, 20, fit.vector, rows, rome, lens=objective == "lens")
    assert abs(got - fit.p) < 1e-4, (got, fit.p)
    assert p_with(m, layout, ids, 20, torch.zeros(576), rows, rome, lens=objective == "lens") < 0.01


def test_the_same_inputs_give_the_same_vector(model):
    m, layout, ids, rome = model
    a = fit_steering(m, layout, ids, 12, rome, SteerConfig(objective="output", max_steps=5, threshold=0.99))
    b = fit_steering(m, layout, ids, 12, rome, SteerConfig(objective="output", max_steps=5, threshold=0.99))
    assert torch.equal(a.vector, b.vector) and a.p == b.p and a.steps == b.steps == 5 and a.stopped == "max_steps"


def test_every_bound_stops_it_and_bad_settings_are_refused(model):
    m, layout, ids, rome = model
    none = fit_steering(m, layout, ids, 20, rome, SteerConfig(max_steps=0))
    assert none.steps == 0 and not none.reached and not none.vector.any() and none.stopped == "max_steps"
    timed = fit_steering(m, layout, ids, 20, rome, SteerConfig(max_seconds=1e-9, threshold=0.999))
    assert timed.stopped == "time" and timed.steps <= 1
    for kwargs in ({"objective": "probe"}, {"positions": "first"}, {"positions": ()}, {"positions": (-1,)},
                   {"threshold": 1.0}, {"lr": 0}):
        with pytest.raises(FitError):
            SteerConfig(**kwargs)
    with pytest.raises(FitError, match="outside"):
        fit_steering(m, layout, ids, 30, rome)
    with pytest.raises(FitError, match="last position"):
        fit_steering(m, layout, ids, 20, rome, SteerConfig(objective="lens", positions=(1,)))
    with pytest.raises(FitError, match="outside the prompt"):
        fit_steering(m, layout, ids, 20, rome, SteerConfig(objective="output", positions=(40,)))
    with pytest.raises(FitError, match="objective 'lens'"):
        fit_steering(m, layout, ids, 20, rome, SteerConfig(objective="output"), J=torch.eye(576))

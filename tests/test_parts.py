"""A request cut into parts (engine/run/parts.py) reads exactly what it reads whole: on the tiny random Llama, a
lens (both lenses, targets, a continuation, an edit) and a generation, cut into one-layer parts, equal the
same request uncut; and the cut is what the cost model counts."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

from lensapp.engine.run import parts
from lensapp.service import GenerateRequest, InterveneRequest, LensRequest, cost


@contextlib.contextmanager
def cut(service, max_cells: int):
    before = service.engine.max_part_cells
    service.engine.max_part_cells = max_cells
    try:
        yield
    finally:
        service.engine.max_part_cells = before


def test_a_lens_cut_into_parts_reads_what_it_reads_whole(tiny_service):
    req = LensRequest(prompts=("The capital of France is",), lens="both", k=3, targets=("Paris", "the city of Rome"))
    whole = tiny_service.lens(req)[0]
    forwards = tiny_service.engine.health()["forwards"].get("lens", 0)
    with cut(tiny_service, 8):                                      # one layer (6 positions x 2 lenses) per part
        pieces = tiny_service.lens(req)[0]
    assert tiny_service.engine.health()["forwards"]["lens"] - forwards == 4      # 4 layers: 4 parts
    assert pieces.layers == whole.layers and pieces.model_next_id == whole.model_next_id
    for name in whole.lenses:
        a, b = whole.lenses[name], pieces.lenses[name]
        assert (a.top_ids == b.top_ids).all()
        np.testing.assert_allclose(a.top_probs, b.top_probs, atol=1e-6)
        np.testing.assert_allclose(a.kl_to_final, b.kl_to_final, atol=1e-6)
        for ta, tb in zip(a.targets, b.targets):
            np.testing.assert_allclose(ta.probs, tb.probs, atol=1e-6)


def test_an_edit_is_made_in_every_part(tiny_service):
    req = InterveneRequest(prompt="The capital of France is", intervention="steer", word="Rome", layer="1",
                           alphas=(0.0, 4.0), k=3)
    whole = tiny_service.intervene(req)
    with cut(tiny_service, 6):
        pieces = tiny_service.intervene(req)
    for a, b in zip([whole.before, *whole.after], [pieces.before, *pieces.after]):
        assert (a.lenses["logit"].top_ids == b.lenses["logit"].top_ids).all()
        np.testing.assert_allclose(a.lenses["logit"].top_probs, b.lenses["logit"].top_probs, atol=1e-6)


def test_a_generation_reads_its_prompt_apart_and_the_same(tiny_service):
    req = GenerateRequest(prompt="Once upon a time there was", max_tokens=3, k=2)
    whole = tiny_service.generate(req)
    with cut(tiny_service, 8):
        pieces = tiny_service.generate(req)
    assert pieces.token_ids == whole.token_ids and len(pieces.steps) == len(whole.steps)
    for a, b in zip(whole.steps, pieces.steps):
        assert (a.readout.lenses["logit"].top_ids == b.readout.lenses["logit"].top_ids).all()
        np.testing.assert_allclose(a.readout.lenses["logit"].top_probs, b.readout.lenses["logit"].top_probs,
                                   atol=1e-6)


@pytest.mark.parametrize("positions, layers, lenses, max_cells", [(6, 4, 2, 8), (512, 30, 1, 4096), (17, 30, 2, 4096),
                                                                  (1, 1, 1, 1), (100, 7, 1, 250)])
def test_the_cost_counts_the_parts_the_engine_makes(positions, layers, lenses, max_cells):
    from lensapp.engine.run.protocol import LensSpec

    spec = LensSpec(input_ids=tuple(range(positions)), read_layers=tuple(range(layers)),
                    rows=tuple(range(layers)), k=1, lenses=("logit", "jacobian")[:lenses],
                    jlens_rows=tuple(range(layers)) if lenses == 2 else None)
    pieces = parts.split_lens(spec, max_cells)
    planned = cost.readout(positions, layers, lenses, [], max_cells)
    assert planned.forwards == len(pieces) and planned.tokens == positions * len(pieces)
    assert [x for p in pieces for x in p.layers] == spec.layers
    assert all(len(p.layers) * positions * lenses <= max(max_cells, positions * lenses) for p in pieces)


@pytest.mark.parametrize("positions, layers, max_cells",
                         [(6, 30, 4096), (33, 31, 4096), (40, 30, 4096), (300, 30, 2048), (5, 2, 16)])
def test_a_generation_never_holds_the_big_turn_and_the_cost_counts_its_parts(positions, layers, max_cells):
    """The engine runs one big part at a time (turns.FairSlots): a generation's own request reads its prompt only
    when that readout is small, else the prompt is read apart in lens parts (its steps, one position each, are
    small where a part holds more than four steps' cells); the cost counts those forwards."""
    from lensapp.engine.run.protocol import LensSpec

    spec = LensSpec(input_ids=tuple(range(positions)), read_layers=tuple(range(layers)), rows=tuple(range(layers)),
                    k=1, lenses=("logit",))
    prompt, generation = parts.split_generation(spec, max_cells)
    assert parts.cells(generation, generation=True) < parts.big_cells(max_cells)
    planned = cost.generation(spec, 4, max_cells)
    assert planned.forwards == 1 + len(prompt)


@pytest.mark.parametrize("positions", range(30, 40))
def test_near_the_threshold_the_cost_counts_what_the_engine_reads_apart(positions):
    """A generation reading 30 of a 31-layer model's layers reads 31 (the last one too: the final distribution).
    The engine and the cost model ask one function whether its prompt is read apart (`parts.prompt_read_apart`), so
    at 34 positions (34 x 30 = 1020 cells asked, 34 x 31 = 1054 read, the threshold 1024) neither misses a forward."""
    from lensapp.service import planning

    spec = planning.lens_spec(list(range(positions)), list(range(30)), 1, ("logit",), 31, [])
    assert spec.read_layers == tuple(range(31))
    prompt, _ = parts.split_generation(spec, 4096)
    assert cost.generation(spec, 4, 4096).forwards == 1 + len(prompt)
    assert bool(prompt) == (positions * 31 >= parts.big_cells(4096))


def test_a_readout_of_the_last_position_counts_and_cuts_its_cells_from_read_from():
    """An evaluation's spec reads only its last position (`read_from`): that is what its cells are (the engine's
    turns) and what it is cut by, so it stays one forward, as the cost model counts it."""
    from lensapp.engine.run.protocol import LensSpec

    n = 200
    spec = LensSpec(input_ids=tuple(range(n)), read_layers=tuple(range(30)), rows=tuple(range(30)), k=1,
                    lenses=("logit", "jacobian"), jlens_rows=tuple(range(30)), read_from=n - 1)
    assert parts.cells(spec) == 1 * 30 * 2
    assert len(parts.split_lens(spec, 256)) == 1
    assert cost.last_positions([n], 30, 2, 256).forwards == 1
    assert cost.last_positions([n], 30, 2, 16).forwards == len(parts.split_lens(spec, 16)) == 4

"""`interventions`: edits and directions on hand-worked tensors, and `Edit`'s checks."""

from __future__ import annotations

import pytest
import torch

from lensapp import interventions as iv
from lensapp.engine.run.edit import Edit
from lensapp.engine.run.protocol import LensSpec

H = torch.tensor([[3.0, 4.0], [1.0, 0.0]])          # two rows of a 2-d stream
V = torch.tensor([0.0, 2.0])                         # u = (0, 1)


def test_add_adds_the_vector_to_every_row():
    assert torch.equal(iv.apply_edit(H, "add", V), torch.tensor([[3.0, 6.0], [1.0, 2.0]]))
    assert torch.equal(iv.edit_delta(H, "add", V), V.expand(2, 2))


def test_project_out_removes_the_component_along_the_unit_vector():
    out = iv.apply_edit(H, "project_out", V)
    assert torch.equal(out, torch.tensor([[3.0, 0.0], [1.0, 0.0]]))
    # any direction: what is left has no component along it, and the rest is untouched
    g = torch.Generator().manual_seed(0)
    h, v = torch.randn(5, 8, generator=g), torch.randn(8, generator=g)
    out = iv.apply_edit(h, "project_out", v)
    u = v / v.norm()
    torch.testing.assert_close(out @ u, torch.zeros(5), atol=1e-6, rtol=0)
    torch.testing.assert_close(out - (out @ u)[:, None] * u, h - (h @ u)[:, None] * u)


def test_set_component_sets_it_to_the_value():
    out = iv.apply_edit(H, "set_component", V, value=5.0)
    assert torch.equal(out, torch.tensor([[3.0, 5.0], [1.0, 5.0]]))
    h, v = torch.randn(4, 6), torch.randn(6)
    torch.testing.assert_close(iv.apply_edit(h, "set_component", v, -1.5) @ (v / v.norm()), torch.full((4,), -1.5))


def test_replace_copies_the_rows_exactly():
    rows = torch.tensor([[7.0, 8.0], [9.0, 10.0]])
    assert torch.equal(iv.apply_edit(H, "replace", rows), rows)
    assert torch.equal(H + iv.edit_delta(H, "replace", rows), rows)   # exact here; in general up to rounding
    with pytest.raises(ValueError, match="does not match"):
        iv.apply_edit(H, "replace", rows[:1])


def test_a_zero_vector_edits_nothing_exactly():
    zero = torch.zeros(2)
    for kind in ("add", "project_out", "set_component"):
        assert torch.equal(iv.apply_edit(H, kind, zero, value=3.0), H), kind
        assert not iv.edit_delta(H, kind, zero, 3.0).any()


def test_edit_rows_prompt_positions_and_generated_tokens():
    # the prompt (5 positions), all of them / two of them (vector rows in the order given)
    assert iv.edit_rows(None, False, 0, 5, 5) == ([0, 1, 2, 3, 4], [0, 1, 2, 3, 4])
    assert iv.edit_rows((3, 1), False, 0, 5, 5) == ([1, 3], [1, 0])
    # a generated token at position 7: only generated edits
    assert iv.edit_rows(None, False, 7, 1, 5) == ([], [])
    assert iv.edit_rows(None, True, 7, 1, 5) == ([0], [0])
    assert iv.edit_rows((1,), False, 7, 1, 5) == ([], [])
    # the prompt continued by a 3-token target (rows 5, 6 are the target's)
    assert iv.edit_rows(None, False, 0, 7, 5)[0] == [0, 1, 2, 3, 4]
    assert iv.edit_rows(None, True, 0, 7, 5)[0] == [0, 1, 2, 3, 4, 5, 6]


def test_typical_norm_is_the_median_without_the_attention_sink():
    h = torch.zeros(2, 4, 2)
    h[0, :, 0] = torch.tensor([100.0, 1.0, 3.0, 2.0])        # position 0 (100) left out: median of 1, 3, 2
    h[1, :, 1] = torch.tensor([50.0, 4.0, 6.0, 8.0])
    assert torch.equal(iv.typical_norm(h), torch.tensor([2.0, 6.0]))
    assert torch.equal(iv.typical_norm(torch.tensor([[[3.0, 4.0]]])), torch.tensor([5.0]))    # one position: it
    assert float(iv.typical_norm(torch.tensor([[0.0, 0.0], [1.0, 0.0], [3.0, 0.0]]))) == 2.0  # even: mean of two


def test_directions_on_a_two_by_two_example():
    W_U = torch.tensor([[1.0, 2.0], [3.0, 4.0]])      # two tokens' unembedding rows
    g = torch.tensor([2.0, 0.5])
    w = iv.logit_direction(W_U, iv.norm_scale(g))
    assert torch.equal(w, torch.tensor([[2.0, 1.0], [6.0, 2.0]]))
    assert torch.equal(iv.logit_direction(W_U, iv.norm_scale(g, plus_one=True)), torch.tensor([[3.0, 3.0], [9.0, 6.0]]))
    J = torch.tensor([[1.0, 1.0], [0.0, 2.0]])
    assert torch.equal(iv.jacobian_direction(w[0], J), torch.tensor([2.0, 4.0]))   # J^T w
    assert torch.equal(iv.difference(w[1], w[0]), torch.tensor([4.0, 1.0]))
    # what the direction means: the lens logit of t, W_U[t] . (g * (h @ J.T)), is h . (J^T w_t)
    h = torch.tensor([0.5, -1.0])
    assert torch.isclose(W_U[0] @ (g * (h @ J.T)), h @ iv.jacobian_direction(w[0], J))


def test_scaled_is_alpha_times_the_norm_long():
    v = iv.scaled(torch.tensor([3.0, 4.0]), alpha=2.0, norm=10.0)
    assert torch.equal(v, torch.tensor([12.0, 16.0]))
    assert not iv.scaled(torch.tensor([3.0, 4.0]), 0.0, 10.0).any()
    assert not iv.scaled(torch.zeros(2), 1.0, 10.0).any()


def test_edits_refuse_what_they_cannot_mean():
    v = torch.zeros(4)
    for kwargs, msg in [({"kind": "steer"}, "not one of"), ({"kind": "replace"}, "2-D"),
                        ({"kind": "add", "positions": ()}, "not empty"),
                        ({"kind": "add", "positions": (1, 1)}, "distinct"),
                        ({"kind": "add", "positions": (1,), "generated": True}, "every position")]:
        with pytest.raises(ValueError, match=msg):
            Edit(layer=0, vector=v, **kwargs)
    with pytest.raises(ValueError, match="rows for 1 positions"):
        Edit(layer=0, kind="replace", vector=torch.zeros(2, 4), positions=(0,))
    spec = LensSpec(input_ids=(1, 2, 3), read_layers=(1,), rows=(0,), k=1, lenses=("logit",),
                    edits=(Edit(layer=2, kind="add", vector=v),))
    with pytest.raises(ValueError, match="outside 0..1"):
        spec.check(n_layers=2, d_model=4)
    with pytest.raises(ValueError, match="d_model 8"):
        spec.check(n_layers=3, d_model=8)
    far = LensSpec(input_ids=(1, 2, 3), read_layers=(1,), rows=(0,), k=1, lenses=("logit",),
                   edits=(Edit(layer=0, kind="add", vector=v, positions=(3,)),))
    with pytest.raises(ValueError, match="outside the prompt"):
        far.check(n_layers=3, d_model=4)

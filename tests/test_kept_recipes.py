"""A kept value's recipe comes back from the page (`ui/kept.py`): it is read by the rules the request it stands for
is read by, whatever the page sends. A generation's branches are a link's (`views.CHAINS`: at most MAX_BRANCHES
chains of at most MAX_FORCES token ids, steps increasing): a forged `{"as": "branches"}` recipe asks no more."""

from __future__ import annotations

import gradio as gr
import pytest

from lensapp.config import MAX_BRANCHES, MAX_FORCES
from lensapp.service import GenerateRequest
from lensapp.service.limits import RateLimiter
from lensapp.ui import kept
from lensapp.ui.guard import Guard


class Generations:
    """A stand-in service: each generation asked is kept (its forces), and answered with them."""

    def __init__(self):
        self.forces = []

    def generate(self, req, ask=None):
        self.forces.append(req.force)
        return f"generated {req.force}"


def remade(made_by) -> tuple[list, Generations]:
    service = Generations()
    return kept.remaker(service, Guard(RateLimiter(per_minute=0)))(made_by, None), service


REQ = GenerateRequest.parse(prompt="The capital of France is", max_tokens=16)


def test_a_kept_pages_branches_are_made_again_from_its_recipe():
    chains = [((3, 7042),), ((3, 7042), (9, 13))]
    value, service = remade(kept.recipe("generate", REQ, "branches", chains))
    assert service.forces == chains and value == [f"generated {c}" for c in chains]


@pytest.mark.parametrize("forces", [
    [[[1, 5]]] * (MAX_BRANCHES + 1),                                     # more branches than a page holds
    [[[step, 5] for step in range(MAX_FORCES + 1)]],                     # more forced tokens than a request takes
    [[[4, 5], [2, 6]]],                                                  # steps that do not increase
    [[[1, "Paris"]]],                                                    # a word, where a page keeps token ids
    [[[1, 5, 6]]], "1=#5", [[[-1, 5]]],                                  # not forces at all; a step before the first
])
def test_a_forged_branches_recipe_asks_nothing_its_request_could_not(forces):
    made_by = {**kept.recipe("generate", REQ, "branches", []), "forces": forces}
    service = Generations()
    with pytest.raises(gr.Error, match="run it again"):
        kept.remaker(service, Guard(RateLimiter(per_minute=0)))(made_by, None)
    assert service.forces == []                                          # nothing was generated

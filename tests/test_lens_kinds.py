"""A lens is one declaration (lensapp/lens_kinds.py): a lens declared before the app is imported is a choice of
the command line, the API and the tabs, and reads what it says it reads; and no module decides anything by
comparing a lens's name.

The first test runs tests/declared_lens.py in a process of its own (the request fields, and so the CLI, the
API and the tabs, are made from the declared lenses as they are imported): it declares the negated logit lens
(norm(-h) unembedded) and nothing else.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lensapp import lens_kinds
from lensapp.lens_kinds import JACOBIAN, LOGIT, Lens

TESTS = Path(__file__).resolve().parent
PACKAGE = TESTS.parent / "lensapp"


@pytest.fixture(scope="module")
def declared(tiny_model_dir) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)])}
    done = subprocess.run([sys.executable, str(TESTS / "declared_lens.py"), str(tiny_model_dir)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_declared_lens_is_a_choice_of_every_surface(declared):
    cli, api, tab = declared["cli"], declared["api"], declared["tab"]
    assert "logit | jacobian | negated | both" in cli["help"]                  # --lens's help
    assert cli["code"] == 0 and set(cli["answer"]["lenses"]) == {"negated"}
    assert "lens" in api["parameters"] and "lens: logit | jacobian | negated | both" in api["doc"]
    assert api["answer"]["lenses"]["negated"]["top_ids"] == cli["answer"]["lenses"]["negated"]["top_ids"]
    assert ["negated logit lens", "negated"] in tab["choices"]                  # the generate tab's lens radio
    assert tab["read"] == ["negated"]


def test_a_declared_lens_reads_what_it_computes_apart(declared):
    read = declared["cli"]["answer"]["lenses"]["negated"]
    probs = np.array(read["top_probs"])
    assert probs.shape == np.array(declared["apart"]["top_probs"]).shape
    np.testing.assert_allclose(probs, declared["apart"]["top_probs"], atol=2e-4)
    np.testing.assert_allclose(probs, declared["apart"]["at_app_ids"], atol=2e-4)
    assert read["top_ids"] != declared["cli"]["logit"]["top_ids"]            # not the logit lens under a new name


def test_a_lens_knows_its_layers_and_when_it_can_be_read():
    assert LOGIT.layers(4, [1, 3]) == [0, 1, 2, 3] and JACOBIAN.layers(4, [1, 3]) == [1, 3]
    assert LOGIT.available(False) and not JACOBIAN.available(False) and JACOBIAN.available(True)
    assert lens_kinds.shown("both") == ("jacobian", "logit") and lens_kinds.read_by("both") == ("logit", "jacobian")
    for taken in ("logit", "both"):
        with pytest.raises(ValueError, match="already declared"):
            lens_kinds.declare(Lens(taken, "again", "again"))


# Where a lens's name may still be compared: its declaration and the fields' parsers. Tab names ("logit" and
# "jacobian" tabs, a link's `tab=`), an intervention's direction ("jacobian": J_l^T of a word's row) and the
# components readout's "logit" (a logit's value) are other things that share the words.
MAY_COMPARE = {"lens_kinds.py", "service/parsers.py"}
TAB_OR_DIRECTION = {"tab", "direction", "kind"}


def lens_name_comparisons(source: str) -> list[str]:
    """`x == "jacobian"`, `"logit" in x`, `x != "both"`... in `source`, but a tab's or a direction's."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        named = [s.value for s in sides if isinstance(s, ast.Constant) and s.value in ("logit", "jacobian", "both")]
        other = " ".join(ast.unparse(s) for s in sides if not isinstance(s, ast.Constant))
        if named and not any(word in other for word in TAB_OR_DIRECTION):
            out.append(f"{node.lineno}: {ast.unparse(node)}")
    return out


def test_no_module_compares_a_lens_by_name():
    assert lens_name_comparisons('J = x if lens == "jacobian" else None\nok = view.tab == "jacobian"') == \
        ["1: lens == 'jacobian'"]
    found = [f"{path.relative_to(PACKAGE)}:{hit}" for path in sorted(PACKAGE.rglob("*.py"))
             if str(path.relative_to(PACKAGE)) not in MAY_COMPARE for hit in lens_name_comparisons(path.read_text())]
    assert found == []

"""issue 28's command-line contract: `generate --force STEP=WORD`, `lens --json`'s decided_at, and `describe`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

KEYS = {"layer", "position", "inspection_prompt", "inspect_layer", "inspect_position", "tokens", "text"}


def run(capsys, argv):
    from lensapp import cli

    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_force_describe_and_decided_at_on_the_tiny_model(capsys, tiny_model_dir):
    model = ["--model", str(tiny_model_dir), "--backend", "transformers", "--jlens", "none"]
    code, out, err = run(capsys, ["generate", "Water boils at", *model, "--max-tokens", "4", "--force", "1=#42",
                                  "--json"])
    assert code == 0, err
    g = json.loads(out)
    assert g["token_ids"][1] == 42 and g["forced"] == [{"step": 1, "token_id": 42, "token": g["tokens"][1]}]
    assert set(g["decided_at"]) == {"logit"} and len(g["decided_at"]["logit"]) == len(g["token_ids"])
    code, out, err = run(capsys, ["lens", "Water boils at", *model, "--json"])
    lens = json.loads(out)["lenses"]["logit"]
    assert code == 0 and len(lens["decided_at"]) == len(lens["top_ids"][0])
    assert all(x is None or 0 <= x <= 3 for x in lens["decided_at"]) and lens["decided_at"][-1] is not None
    code, out, err = run(capsys, ["describe", "Water boils at", *model, "--layer", "2", "--position", "1",
                                  "--max-tokens", "3", "--json"])
    assert code == 0, err
    d = json.loads(out)
    assert KEYS <= set(d) and (d["layer"], d["position"], d["inspect_layer"], len(d["tokens"])) == (2, 1, 2, 3)
    code, out, err = run(capsys, ["describe", "Water boils at", *model, "--layer", "all", "--max-tokens", "2",
                                  "--inspect", "a -> a; ?", "--inspect-layer", "1", "--json"])
    sweep = json.loads(out)
    assert code == 0 and [x["layer"] for x in sweep] == [0, 1, 2, 3] and {x["inspect_layer"] for x in sweep} == {1}
    code, out, err = run(capsys, ["describe", "Water boils at", *model, "--layer", "2"])
    assert code == 0 and "layer   2 (into layer 2)" in out


@pytest.mark.parametrize("argv, says", [
    (["generate", "Hi", "--force", "2"], "STEP=WORD"),
    (["generate", "Hi", "--max-tokens", "3", "--force", "5=#1"], "past the 3 tokens"),
    (["generate", "Hi", "--temperature", "1", "--force", "1=#1"], "needs a seed"),
    (["describe", "Hi", "--layer", "40"], "layer 40 is outside"),
    (["describe", "Hi"], "no layer given"),
    (["describe", "Hi", "--layer", "3", "--max-tokens", "99"], "max_tokens"),
])
def test_bad_input_is_one_line_before_the_engine_starts(capsys, embedded_dir, argv, says):
    code, out, err = run(capsys, [*argv, "--jlens", "none"])
    assert code == 2 and out == "" and err.startswith("error: ") and says in err and err.count("\n") == 1, err


@pytest.mark.extended
def test_the_contract_through_a_subprocess_with_the_real_engine(embedded_dir):
    root = Path(__file__).resolve().parents[1]

    def lensapp(*argv) -> object:
        out = subprocess.run([sys.executable, "-m", "lensapp", *argv, "--jlens", "none", "--json"], cwd=root,
                             capture_output=True, text=True, timeout=900)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout)

    g = lensapp("generate", "The capital of France is", "--max-tokens", "6", "--seed", "3", "--force", "1= Rome")
    assert g["tokens"][1] == " Rome" and g["forced"][0]["step"] == 1
    sweep = lensapp("describe", "The Eiffel Tower is in the city of", "--layer", "all", "--position", "4")
    assert [d["layer"] for d in sweep] == list(range(30)) and all(KEYS <= set(d) for d in sweep)

"""`python -m lensapp` through `cli.main(argv)`: bad input answered before any engine starts; the JSON schema.

The bad-input cases run against the embedded model's config and tokenizer only (the CLI checks them
before vLLM spends a minute starting). The successful runs use the TransformersModel backend on the
tiny model, so they take seconds; the vLLM engine itself is tested in test_engine_vllm.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lensapp import cli, jlens


def run(capsys, argv) -> tuple[int, str, str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def lens_d8(tmp_path_factory):
    return jlens.save(tmp_path_factory.mktemp("l") / "d8.pt", {0: torch.eye(8)}, n_prompts=1)


@pytest.mark.parametrize("argv, message", [
    (["lens", " "], "the prompt is empty"),
    (["lens", "Hello", "--k", "0"], "k must be a whole number in 1..100"),
    (["lens", "Hello", "--k", "101"], "k must be a whole number in 1..100"),
    (["lens", "Hello", "--layers", "99"], "30-layer model"),
    (["lens", "Hello", "--layers", "3-x"], "layers"),
    (["lens", "Hello", "--lens", "jacobian", "--jlens", "/no/such/lens.pt"], "no such file"),
    (["lens", "Hello", "--lens", "both", "--jlens", "LENS_D8"], "has d_model 8, but the model has d_model 576"),
    (["lens", "Hello " * 600], "the limit is 512"),
    (["generate", "Hello", "--max-tokens", "999"], "max_tokens"),
    (["lens", "Hello", "--backend", "tpu"], None),            # argparse's own usage error
    (["lens", "Hello", "--max-prompt-tokens", "0"], "max_prompt_tokens"),
])
def test_bad_input_is_one_line_and_exit_2_before_the_engine_starts(capsys, embedded_dir, lens_d8, argv, message):
    argv = [str(lens_d8) if a == "LENS_D8" else a for a in argv]
    try:
        code, out, err = run(capsys, argv)
    except SystemExit as e:                                   # argparse exits by itself
        code, (out, err) = e.code, capsys.readouterr()
    assert code == 2 and out == "" and "Traceback" not in err
    if message is not None:
        assert err.startswith("error: ") and message in err and err.count("\n") == 1, err


def test_lens_json_has_the_apps_schema(capsys, tiny_model_dir):
    code, out, err = run(capsys, ["lens", "The capital of France is", "--model", str(tiny_model_dir),
                                  "--backend", "transformers", "--k", "3", "--target", "Paris", "--json"])
    assert code == 0, err
    r = json.loads(out)
    n_pos, layers = len(r["input_tokens"]), r["layers"]
    assert layers == [0, 1, 2, 3] and n_pos == 5 and isinstance(r["model_next_token"], str)
    logit = r["lenses"]["logit"]
    assert [len(logit["top_ids"]), len(logit["top_ids"][0]), len(logit["top_ids"][0][0])] == [4, n_pos, 3]
    assert len(logit["top_tokens"][3][n_pos - 1]) == 3 and len(logit["entropy"]) == 4
    assert all(p >= q for p, q in zip(logit["top_probs"][0][0], logit["top_probs"][0][0][1:]))
    assert logit["kl_to_final"][3] == pytest.approx([0.0] * n_pos, abs=1e-5)   # the last layer is the model
    assert logit["targets"][0]["text"] == "Paris"


def test_lens_table_and_generate_json(capsys, tiny_model_dir):
    model = ["--model", str(tiny_model_dir), "--backend", "transformers"]
    code, out, err = run(capsys, ["lens", "Water boils at", *model, "--layers", "2,3"])
    assert code == 0, err
    assert "top-1 per layer" in out and "top-5 at the last position" in out
    code, out, err = run(capsys, ["generate", "Water boils at", *model, "--max-tokens", "3", "--json"])
    assert code == 0, err
    g = json.loads(out)
    assert isinstance(g["text"], str) and 1 <= len(g["steps"]) <= 3


@pytest.mark.extended
def test_json_on_stdout_is_only_json_with_the_real_engine(embedded_dir):
    """`python -m lensapp lens ... --json > x.json` on vLLM: every log line goes to stderr."""
    out = subprocess.run([sys.executable, "-m", "lensapp", "lens", "The capital of France is", "--layers", "28,29",
                          "--k", "2", "--jlens", "none", "--json"], cwd=Path(__file__).resolve().parents[1],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout)
    assert r["model_next_token"] == " Paris" and r["layers"] == [28, 29]


def test_serve_on_a_port_in_use_says_so_in_one_line_before_starting_the_engine(capsys):
    """A second app on the same port: one line and exit 2 at once, not vLLM's half-minute start then
    uvicorn's bind error and a traceback."""
    import socket
    import time

    from lensapp import shell

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        t = time.perf_counter()
        code, out, err = run(capsys, ["serve", "--host", "127.0.0.1", "--port", str(port)])
        assert time.perf_counter() - t < 10
        assert code == 2 and out == ""
        assert err.strip() == f"error: port {port} on 127.0.0.1 is in use (another app?); choose another with --port"
    shell.listen("127.0.0.1", port).close()       # free again once its owner closed it (else shell.ListenError)

""""Show the code" reads as the app reads: each tab's script (lens, intervention, components), written by the tab's
own `code_for` and run as a file (as a notebook user's cell: nnsight reads its source), prints the app's numbers
where reading is easy to get wrong:

- a SentencePiece tokenizer with a dummy prefix (Llama 2's kind: `" Paris"` starts with the lone `▁`), a word after
  a prompt that ends in a space, a from-word, punctuation, CJK text (tests/word_tokenizers.py);
- a tokenizer without BOS (Qwen's kind) under a hub lens, which the app reads with BOS first where the tokenizer has
  one (jlens.fitted_with_bos: a hub file records no provenance, so the reference's default);
- the chat template, as the app's chat option applies it.

The lens is a hub file in the reference's format (J, source_layers, n_prompts, d_model: no provenance), fetched by
the app and by the scripts through huggingface_hub's `hf_hub_download`, which here hands out the local file (no
network). The app is the service on the transformers backend (fp32), so a script agrees with it to rounding.
"""

from __future__ import annotations

import inspect
import itertools
import json
import runpy
import sys
from io import StringIO
from pathlib import Path

import huggingface_hub
import numpy as np
import pytest
import torch
from conftest import random_jacobians
from transformers import AutoTokenizer
from word_tokenizers import CONTEXT, tiny_model

from lensapp import config, jlens, tokenizing
from lensapp.service import ComponentsRequest, InterveneRequest, LensRequest, LensService
from lensapp.ui import components_tab, intervene_tab, lens_tab

HUB_REPO, HUB_FILE = "neuronpedia/jacobian-lens", "tiny/jlens/wikitext/tiny_jacobian_lens.pt"
CJK = "法国的首都是"
SCRIPTS = itertools.count()
KINDS = ("sentencepiece", "no BOS")


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    """Every test here on one torch thread (conftest's `one_thread`)."""


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """huggingface_hub's `hf_hub_download` handing out a lens file saved as the reference saves one, for HUB_REPO's
    HUB_FILE only; yields a function that writes the lens for a model of d_model and n_layers."""
    folder = tmp_path_factory.mktemp("hub")

    def download(repo_id, filename, **_):
        if (repo_id, filename) != (HUB_REPO, HUB_FILE):
            raise FileNotFoundError(f"{repo_id}:{filename} is not on this test's hub")
        return str(folder / "lens.pt")

    def publish(d_model: int, n_layers: int) -> str:
        J = {layer: m.to(torch.float16) for layer, m in random_jacobians(d_model, range(n_layers - 1)).items()}
        torch.save({"J": J, "source_layers": sorted(J), "n_prompts": 10, "d_model": d_model}, folder / "lens.pt")
        return f"{HUB_REPO}:{HUB_FILE}"

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(huggingface_hub, "hf_hub_download", download)
        yield publish


def serve(folder, hub):
    """The service on `folder` (transformers backend, no cache) reading with the hub's lens."""
    service = LensService.start(config.Config.of(model=str(folder), backend="transformers", jlens="none",
                                              cache_entries=0))
    service.wait_ready(300)
    lens = service.load_jlens(hub(service.info.d_model, service.info.n_layers))
    assert lens.provenance == {} and jlens.fitted_with_bos(lens) is True and service.prompts.bos
    return service


@pytest.fixture(scope="module")
def app(request, tmp_path_factory, embedded_dir, hub):
    """(kind, the service, its tokenizer) for the kind a test names (KINDS): a Llama with the dummy-prefix
    SentencePiece tokenizer, or a Qwen3 with the byte-level tokenizer and no BOS token at all (as Qwen3-8B's)."""
    folder = tmp_path_factory.mktemp("sentencepiece" if request.param == "sentencepiece" else "nobos")
    if request.param == "sentencepiece":
        tiny_model("sentencepiece", folder, embedded_dir)
    else:
        tiny_model("bytelevel", folder, embedded_dir, model_type="qwen3")
        tok = AutoTokenizer.from_pretrained(folder)
        tok.bos_token = None
        tok.save_pretrained(folder)
    settings = json.loads((folder / "config.json").read_text())      # room for the typical norms' reference text
    (folder / "config.json").write_text(json.dumps(settings | {"max_position_embeddings": 512}))
    tok = AutoTokenizer.from_pretrained(folder)
    assert (tok.bos_token_id is None) == (request.param == "no BOS")
    service = serve(folder, hub)
    yield request.param, service, tok
    service.close()


def run_script(code: str, folder, monkeypatch) -> tuple[dict, str]:
    """The script run as a file from the model folder's parent (its MODEL is the folder's name, as the tab names
    a local model): its globals and what it printed. Each script is a file of its own name: nnsight reads a
    file's source once per process."""
    monkeypatch.chdir(folder.parent)
    script = folder.parent / f"{folder.name}-script-{next(SCRIPTS)}.py"
    script.write_text(code)
    out, sys.stdout = sys.stdout, StringIO()
    try:
        found = runpy.run_path(str(script))
        return found, sys.stdout.getvalue()
    finally:
        sys.stdout = out


def folder_of(service) -> Path:
    return Path(service.cfg.engine.model)


@pytest.mark.parametrize("chat", [False, True], ids=["text", "chat"])
@pytest.mark.parametrize("app", KINDS, indirect=True)
def test_the_lens_script_reads_the_apps_tokens_and_numbers(app, chat, monkeypatch):
    kind, service, tok = app
    prompt = CONTEXT if kind == "sentencepiece" else CJK
    result = service.lens(LensRequest(prompts=(prompt,), lens="both", k=3, chat=chat))[0]
    assert (result.input_ids[0] == tok.bos_token_id) == (kind == "sentencepiece")
    code = lens_tab.code_for(service, result, "both", "transformers", chat)
    assert f"hf_hub_download({HUB_REPO!r}, {HUB_FILE!r})" in code
    readout = run_script(code, folder_of(service), monkeypatch)[0]["readout"]
    for name, lens in result.lenses.items():
        for row, layer in enumerate(result.layers):
            want = [[tok.decode([int(i)]), float(p)] for i, p in zip(lens.top_ids[row, -1], lens.top_probs[row, -1])]
            got = readout[name][layer]
            assert [t for t, _ in got] == [t for t, _ in want], (name, layer, got, want)
            np.testing.assert_allclose([p for _, p in got], [p for _, p in want], atol=1e-4, err_msg=f"{name} {layer}")


# (kind, request, chat): each reads a word where a space put before it misreads it, or reads with BOS or chat.
INTERVENTIONS = [
    ("sentencepiece", {"prompt": CONTEXT + " ", "intervention": "steer", "word": "Paris", "from_word": "Rome",
                       "layer": "1", "direction": "jacobian", "alphas": "0,0.5"}, False),
    ("sentencepiece", {"prompt": CJK, "intervention": "ablate", "word": "巴黎", "layer": "0-1"}, True),
    ("sentencepiece", {"prompt": CONTEXT, "intervention": "patch", "source": "The capital of Italy is", "layer": "0-1",
                       "positions": "1-2", "source_positions": "1-2", "targets": "."}, True),
    ("no BOS", {"prompt": CJK, "intervention": "steer", "word": "巴黎", "from_word": ",", "layer": "1",
                "direction": "jacobian", "alphas": "0.5"}, True),
    ("no BOS", {"prompt": CONTEXT, "intervention": "ablate", "word": ".", "layer": "1", "direction": "jacobian"},
     False),
]


@pytest.mark.parametrize("app, fields, chat", INTERVENTIONS, indirect=["app"],
                         ids=[f"{k}-{f['intervention']}-{'chat' if c else 'text'}" for k, f, c in INTERVENTIONS])
def test_the_intervention_script_makes_the_apps_change(app, fields, chat, monkeypatch):
    _, service, _ = app
    result = service.intervene(InterveneRequest.parse(**fields, chat=chat))
    code = intervene_tab.code_for(service, result, chat)
    assert f"CHAT = {chat!r}" in code and "BOS = True" in code
    printed = run_script(code, folder_of(service), monkeypatch)[1]
    got = [float(line.rsplit(" ", 1)[-1]) for line in printed.strip().splitlines()]
    want = result.dose_response()["prob"].tolist()
    assert len(got) == len(want) == len(result.labels) + 1
    # A random model's probability of a word can be 1e-19: compared relative to itself (to fp32 rounding).
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=0, err_msg=printed)


# (kind, request, chat): punctuation, a word after a trailing space (SentencePiece reads "Pa"), CJK.
COMPONENTS = [
    ("sentencepiece", {"prompt": CONTEXT, "target": ",", "foil": "Paris", "patterns": 1}, True),
    ("sentencepiece", {"prompt": CONTEXT + " ", "target": "Paris", "foil": "Rome"}, False),
    ("no BOS", {"prompt": CJK, "target": "巴黎", "foil": "Paris", "patterns": 0}, True),
]


@pytest.mark.parametrize("app, fields, chat", COMPONENTS, indirect=["app"],
                         ids=[f"{k}-{f['target']}-{'chat' if c else 'text'}" for k, f, c in COMPONENTS])
def test_the_components_script_explains_the_apps_logit(app, fields, chat, monkeypatch):
    _, service, _ = app
    result = service.components(ComponentsRequest(**fields, chat=chat))
    got = run_script(components_tab.code_for(service, result, chat), folder_of(service), monkeypatch)[0]
    got, want = got["components"], result.to_json()
    scale = max(abs(want["logit"]), float(np.abs(result.heads).max()), float(np.abs(result.attn).max()))
    for key in ("embed", "attn", "mlp", "heads", "bias"):
        np.testing.assert_allclose(got["parts"][key], want["parts"][key], atol=1e-4 * scale, err_msg=key)
    assert got["logit"] == pytest.approx(want["logit"], abs=1e-4 * scale)
    if "patterns" in want:
        layer = str(fields["patterns"])
        np.testing.assert_allclose(got["patterns"][layer], want["patterns"][layer], atol=1e-5)


def test_a_script_carries_the_apps_own_rule_not_a_copy():
    """The scripts run tokenizing.py's functions as written there: a change to the rule is a change to every script
    (and the tests above run it)."""
    from lensapp.snippets import rules

    code = rules(words=True)
    for function in (tokenizing.prompt_ids, tokenizing.word_ids, tokenizing.joined, jlens.with_bos):
        assert inspect.getsource(function) in code
    assert "word_ids" not in rules(words=False)

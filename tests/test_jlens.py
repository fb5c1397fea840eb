"""lensapp.jlens on files the tests make: the published format, validation messages, hub resolution offline."""

from __future__ import annotations

import logging
import pickle

import pytest
import torch

from lensapp import jlens, provenance
from lensapp.jlens import LensFileError

D, N_LAYERS = 8, 4


def lens_file(path, J=None, **extra):
    J = J if J is not None else {layer: torch.randn(D, D) for layer in range(N_LAYERS - 1)}
    raw = {"J": J, "source_layers": sorted(J), "n_prompts": 7, "d_model": D, **extra}
    torch.save(raw, path)
    return path


def test_save_load_round_trip_keeps_selected_layers_in_bf16(tmp_path):
    J = {layer: torch.randn(D, D) for layer in range(N_LAYERS - 1)}
    path = jlens.save(tmp_path / "l.pt", J, n_prompts=12, provenance={"model": "tiny", "T": 64})
    lens = jlens.load(path, d_model=D, n_layers=N_LAYERS, layers=[2, 0])
    assert lens.layers == [0, 2] and lens.n_prompts == 12 and lens.J[0].dtype == torch.bfloat16
    torch.testing.assert_close(lens.J[2].float(), J[2].to(torch.bfloat16).float())
    assert lens.describe() == {"source": "l.pt", "n_prompts": 12, "d_model": D, "layers": [0, 2],
                               "provenance": lens.provenance}
    assert lens.provenance["model"] == "tiny" and lens.warnings == []


@pytest.mark.parametrize("make, load_kw, message", [
    (lambda p: lens_file(p, J={0: torch.eye(D + 1)}, d_model=D + 1), {},
     f"has d_model {D + 1}, but the model has d_model {D}"),
    (lambda p: lens_file(p, J={5: torch.eye(D)}), {}, f"source layers [5] outside 0..{N_LAYERS - 2}"),
    (lambda p: lens_file(p), {"layers": [0, 9]}, "has no J for layers [9]"),
    (lambda p: lens_file(p, J={0: torch.eye(D)[:4]}, d_model=D), {}, f"J[0] is (4, {D}), expected ({D}, {D})"),
    (lambda p: lens_file(p, J={0: torch.full((D, D), float("nan"))}), {}, "non-finite"),
    (lambda p: torch.save({"weights": torch.eye(D)}, p) or p, {}, "expected a dict with a 'J' dict"),
    (lambda p: (p.write_text("not a lens"), p)[1], {}, "not a torch.save file of tensors"),
    (lambda p: torch.save({"J": {}}, p) or p, {}, "must map layer numbers to matrices"),
    (lambda p: torch.save({"J": {}, "d_model": D}, p) or p, {}, "'J' holds no matrices"),
    (lambda p: torch.save({"J": {"layer0": torch.eye(D)}}, p) or p, {}, "must map layer numbers to matrices"),
])
def test_files_that_do_not_fit_get_one_clear_message(tmp_path, make, load_kw, message):
    path = make(tmp_path / "bad.pt")
    with pytest.raises(LensFileError) as e:
        jlens.load(path, d_model=D, n_layers=N_LAYERS, **load_kw)
    assert message in str(e.value) and "\n" not in str(e.value)


class Payload:
    """Unpickling this would run code; weights_only refuses the class outright."""

    def __reduce__(self):
        return (print, ("this must never run",))


def test_a_file_carrying_code_is_refused_not_run(tmp_path, capsys):
    path = tmp_path / "evil.pt"
    with open(path, "wb") as f:
        torch.save({"J": {0: torch.eye(D)}, "extra": Payload()}, f, pickle_module=pickle)
    with pytest.raises(LensFileError, match="not a torch.save file of tensors"):
        jlens.load(path, d_model=D, n_layers=N_LAYERS)
    assert "must never run" not in capsys.readouterr().out


def test_unknown_keys_are_dropped_with_a_warning(tmp_path, caplog):
    path = lens_file(tmp_path / "l.pt", optimizer_state=torch.zeros(3))
    with caplog.at_level(logging.WARNING, logger="lensapp.jlens"):
        lens = jlens.load(path, d_model=D, n_layers=N_LAYERS)
    assert lens.layers == [0, 1, 2] and "optimizer_state" in caplog.text


def test_lens_of_another_model_loads_with_a_warning(tmp_path):
    path = jlens.save(tmp_path / "l.pt", {0: torch.eye(D)}, n_prompts=1, provenance={"model": "Qwen/Qwen3-8B"})
    assert jlens.load(path, d_model=D, n_layers=N_LAYERS, model_name="/models/qwen3-8b/").warnings == []
    lens = jlens.load(path, d_model=D, n_layers=N_LAYERS, model_name="SmolLM2-135M-Instruct")
    assert len(lens.warnings) == 1 and "'Qwen/Qwen3-8B'" in lens.warnings[0] and "SmolLM2" in lens.warnings[0]


def test_identity_lens_has_every_source_layer():
    J = jlens.identity(D, [0, 2])
    assert sorted(J) == [0, 2] and torch.equal(J[2], torch.eye(D))


def test_hub_spec_resolves_from_the_hub_cache_offline(tmp_path, monkeypatch):
    """`REPO:PATH` goes through huggingface_hub; a cached snapshot is found without the network."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # huggingface_hub reads the variable once, when it is first imported (by now it is): without its constant the
    # missing file below was asked of the hub, retried for ~20 s until the closed network refused it
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    snapshot = tmp_path / "models--org--lenses" / "snapshots" / ("a" * 40)
    (snapshot / "tiny").mkdir(parents=True)
    lens_file(snapshot / "tiny" / "lens.pt")
    (tmp_path / "models--org--lenses" / "refs").mkdir()
    (tmp_path / "models--org--lenses" / "refs" / "main").write_text("a" * 40)
    lens = jlens.load("org/lenses:tiny/lens.pt", d_model=D, n_layers=N_LAYERS, cache_dir=tmp_path)
    assert lens.layers == [0, 1, 2] and lens.describe()["source"] == "org/lenses:tiny/lens.pt"
    with pytest.raises(LensFileError, match="could not download from the hub"):
        jlens.load("org/lenses:tiny/missing.pt", d_model=D, n_layers=N_LAYERS, cache_dir=tmp_path)


@pytest.mark.parametrize("spec", ["no-such-file.pt", "org:x.pt", "a/b/c:x.pt", "org/repo:"])
def test_a_spec_that_is_neither_a_file_nor_a_hub_path_is_refused(spec):
    with pytest.raises(LensFileError, match="no such file, and not of the form HUB_REPO:PATH_IN_REPO"):
        jlens.resolve(spec)


def test_lens_fitted_against_another_unembedding_loads_with_a_warning(tmp_path):
    path = jlens.save(tmp_path / "l.pt", {0: torch.eye(D)}, n_prompts=1, provenance={"unembedding": "0123abcd"})
    assert jlens.load(path, d_model=D, n_layers=N_LAYERS, unembedding="0123abcd").warnings == []
    lens = jlens.load(path, d_model=D, n_layers=N_LAYERS, unembedding="ffff0000")
    assert len(lens.warnings) == 1 and "0123abcd" in lens.warnings[0] and "ffff0000" in lens.warnings[0]


@pytest.mark.parametrize("tied", [True, False])
def test_unembedding_fingerprint_from_files_matches_the_loaded_model(tmp_path, tied):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=2000, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=tied)
    model = LlamaForCausalLM(cfg)
    model.to(torch.bfloat16).save_pretrained(tmp_path / "m")
    on_disk = provenance.model_unembedding_fingerprint(tmp_path / "m")
    loaded = LlamaForCausalLM.from_pretrained(tmp_path / "m", dtype=torch.float32)   # fp32 of bf16 weights
    assert on_disk == provenance.unembedding_fingerprint(loaded.get_output_embeddings().weight)
    other = LlamaForCausalLM(cfg)                                                    # other random weights
    assert on_disk != provenance.unembedding_fingerprint(other.get_output_embeddings().weight)
    assert provenance.model_unembedding_fingerprint(tmp_path / "nothing") is None


def test_bos_as_the_lens_was_fitted(tmp_path):
    """with_bos prepends once; a hub lens follows the reference (BOS), a local file says so or is unknown;
    bos_warning names a prompt that starts unlike the fitted ones."""
    assert jlens.with_bos([5, 6], 1) == [1, 5, 6] and jlens.with_bos([1, 5], 1) == [1, 5]
    assert jlens.with_bos([5], None) == [5]
    J = {0: torch.eye(4)}
    hub = jlens.JacobianLens(J=J, n_prompts=1, d_model=4, source="neuronpedia/jacobian-lens:qwen3-8b/x.pt")
    local = jlens.JacobianLens(J=J, n_prompts=1, d_model=4, source=str(tmp_path))
    said = jlens.JacobianLens(J=J, n_prompts=1, d_model=4, source=str(tmp_path), provenance={"bos": False})
    assert [jlens.fitted_with_bos(x) for x in (hub, local, said)] == [True, None, False]
    # the reference puts BOS first only where the tokenizer has one (Qwen3's has none): no false warning there
    assert jlens.fitted_with_bos(hub, tokenizer_has_bos=False) is False and jlens.fitted_with_bos(said, False) is False
    assert jlens.bos_warning(jlens.fitted_with_bos(hub, tokenizer_has_bos=False), [5, 6], None) is None
    assert jlens.bos_warning(True, [1, 5], 1) is None and jlens.bos_warning(None, [5], 1) is None
    assert "tokenizer has none" in jlens.bos_warning(True, [5], None)
    assert "fitted without a BOS" in jlens.bos_warning(False, [1, 5], 1)


def test_the_service_reads_a_bos_lens_with_bos_and_warns_when_a_prompt_differs(tiny_service, monkeypatch):
    """The transformers backend (the service decides the ids for both backends): with a lens fitted with BOS
    every prompt is read with BOS first, whichever lens reads it (one rule: tests/test_bos.py has every kind);
    a chat prompt (its template starts with the tokenizer's BOS) read by a lens fitted without BOS carries a
    warning."""
    from lensapp import config, ui
    from lensapp.service import LensRequest
    from lensapp.ui import lens_tab

    bos, old = tiny_service.prompts.bos_id, tiny_service.jlens
    n, d = tiny_service.info.n_layers, tiny_service.info.d_model
    plain = tiny_service.prompts.ids("Water boils")
    assert bos is not None and plain[0] != bos
    try:
        tiny_service.install_jlens(jlens.JacobianLens(J=jlens.identity(d, list(range(n - 1))), n_prompts=0,
                                                      d_model=d, provenance={"bos": True}))
        r = tiny_service.lens(LensRequest(prompts=("Water boils",), lens="both", k=1))[0]
        assert r.input_ids == [bos] + plain and "warnings" not in r.jlens
        assert tiny_service.lens(LensRequest(prompts=("Water boils",), lens="logit", k=1))[0].input_ids == [bos] + plain
        tiny_service.install_jlens(jlens.JacobianLens(J=jlens.identity(d, list(range(n - 1))), n_prompts=0,
                                                      d_model=d, provenance={"bos": False}))
        r = tiny_service.lens(LensRequest(prompts=("Water boils",), lens="jacobian", k=1, chat=True))[0]
        assert r.input_ids[0] == bos and "fitted without a BOS" in r.jlens["warnings"][0]
        said = []                                   # the page says it too, as a warning beside the chart
        monkeypatch.setattr(lens_tab, "warn", said.append)
        page = ui.build_ui(tiny_service, config.WebSettings(), config.LimitSettings(rate_limit=0)).tabs["jacobian"]
        page.run({"prompt": "Water boils", "layers": "all", "k": 1, "metric": "top1_prob", "chat": True})
        assert len(said) == 1 and "fitted without a BOS" in said[0]
    finally:
        tiny_service.install_jlens(old)


def test_a_lens_warns_when_the_releases_or_revision_it_was_fitted_under_differ(tmp_path):
    """Recorded versions are compared by release series (major.minor): another series or another model revision
    warns, naming both sides; a patch release or a local build tag does not; a file that records none loads
    without a word. The description carries the versions and the warnings, and orjson takes it."""
    import orjson

    running = provenance.library_versions()
    assert {"torch", "transformers", "nnsight"} <= set(running)
    series = {name: provenance.release_series(v) for name, v in running.items()}
    older = {**running, "transformers": "4.40.0"}
    path = jlens.save(tmp_path / "old.pt", {0: torch.eye(D)}, n_prompts=1,
                      provenance={"versions": older, "revision": "a" * 40})
    lens = jlens.load(path, d_model=D, n_layers=N_LAYERS, versions=running, revision="b" * 40)
    assert len(lens.warnings) == 2
    assert f"transformers 4.40.0 (serving with {running['transformers']})" in lens.warnings[0]
    assert "torch" not in lens.warnings[0] and "nnsight" not in lens.warnings[0]
    assert "revision aaaaaaaaaaaa" in lens.warnings[1] and "revision bbbbbbbbbbbb" in lens.warnings[1]
    described = lens.describe()
    assert described["provenance"]["versions"] == older and described["warnings"] == lens.warnings
    assert orjson.loads(orjson.dumps(described)) == described

    patched = {name: f"{series[name]}.999+local" for name in running}
    path = jlens.save(tmp_path / "patched.pt", {0: torch.eye(D)}, n_prompts=1, provenance={"versions": patched})
    assert jlens.load(path, d_model=D, n_layers=N_LAYERS, versions=running, revision="b" * 40).warnings == []
    unrecorded = lens_file(tmp_path / "published.pt", provenance={"model": "x"})
    assert jlens.load(unrecorded, d_model=D, n_layers=N_LAYERS, versions=running, revision="b" * 40).warnings == []
    assert "warnings" not in jlens.load(unrecorded, d_model=D, n_layers=N_LAYERS, versions=running).describe()


def test_the_json_and_the_page_say_when_a_lens_was_fitted_under_other_releases(tiny_service, tmp_path,
                                                                               monkeypatch):
    """Loaded through the service, a lens fitted under another transformers series carries the warning in every
    result's `jlens` (the CLI's and the API's JSON) and as a note in the Jacobian tab, which does not repeat it
    as a pop-up at each readout."""
    from lensapp import config, ui
    from lensapp.service import LensRequest
    from lensapp.ui import lens_tab

    old = tiny_service.jlens
    n, d = tiny_service.info.n_layers, tiny_service.info.d_model
    versions = {**provenance.library_versions(), "transformers": "4.40.0"}
    path = jlens.save(tmp_path / "l.pt", jlens.identity(d, list(range(n - 1))), n_prompts=1,
                      provenance={"versions": versions})
    try:
        tiny_service.load_jlens(str(path))
        r = tiny_service.lens(LensRequest(prompts=("Water boils",), lens="both", k=1))[0]
        (warning,) = r.jlens["warnings"]
        assert "transformers 4.40.0 (serving with" in warning
        assert r.to_json()["jlens"]["warnings"] == [warning]
        said = []
        monkeypatch.setattr(lens_tab, "warn", said.append)
        page = ui.build_ui(tiny_service, config.WebSettings(), config.LimitSettings(rate_limit=0))
        notes = [b.value for b in page.demo.blocks.values()
                 if "lens-warning" in (getattr(b, "elem_classes", None) or [])]
        assert notes == [f"**Note:** {lens_tab.md_text(warning)}."]
        page.tabs["jacobian"].run({"prompt": "Water boils", "layers": "all", "k": 1, "metric": "top1_prob"})
        assert said == []
    finally:
        tiny_service.install_jlens(old)

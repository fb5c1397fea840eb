"""lensapp.fitting on a tiny random Llama: J against a brute-force Jacobian, save/load, merge, resume, errors."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from lensapp import cli, corpus, fitting, jlens, provenance
from lensapp.engine.run.families import LLAMA_HF
from lensapp.fitting import FitConfig, FitError

N_LAYERS, D_MODEL, T, SKIP = 4, 32, 24, 4


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    """Every test here on one torch thread (conftest's `one_thread`)."""


def tiny_model():
    """nnsight's TransformersModel over a tiny random Llama (fp64), as the fitter gets it; the same in any process
    (a fit worker's `load`)."""
    from nnsight import TransformersModel
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=100, hidden_size=D_MODEL, intermediate_size=64, num_hidden_layers=N_LAYERS,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                         initializer_range=0.2)  # far from identity, so a wrong J cannot pass by accident
    # The prompts are token ids; the tokenizer only satisfies TransformersModel's pipeline.
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({str(i): i for i in range(100)},
                                                                                    unk_token="0")))
    return TransformersModel(LlamaForCausalLM(config).double().eval(), tokenizer=tokenizer)


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(1)
    # 30 tokens (truncated to T), 20, 5 (<= skip + 1: skipped), 12, 24
    return [torch.randint(0, 100, (n,), generator=g).tolist() for n in (30, 20, 5, 12, 24)]


def cfg(tmp_path, **kw) -> FitConfig:
    base = {"tokens": T, "skip": SKIP, "dim_batch": 5, "min_prompts": 1, "max_prompts": 100, "threshold": 0.0,
            "window": 1, "checkpoint_every": 1, "checkpoint_dir": tmp_path / "ckpt", "save_dtype": "float32"}
    return FitConfig(**(base | kw))


def load(path):
    return jlens.load(path, d_model=D_MODEL, n_layers=N_LAYERS, dtype=torch.float64)


def brute_force(model, ids: list[int], layer: int) -> torch.Tensor:
    """mean over valid source positions, sum over valid target positions, of d h_final / d h_layer."""
    ids = torch.tensor(ids[:T])[None]
    blocks = model.model.layers

    valid = slice(SKIP, ids.shape[1] - 1)

    def h_final(x):  # x = h_layer [1, n, d_model] -> h_final summed over valid target positions [d_model]
        out = {}
        replace = blocks[layer].register_forward_hook(lambda m, a, o: x)
        grab = blocks[-1].register_forward_hook(
            lambda m, a, o: out.setdefault("h", o[0] if isinstance(o, tuple) else o))
        try:
            model.model(input_ids=ids, use_cache=False)
        finally:
            replace.remove()
            grab.remove()
        return out["h"][0, valid].sum(0)

    with torch.no_grad():
        x0 = {}
        hook = blocks[layer].register_forward_hook(lambda m, a, o: x0.setdefault("h", o))
        model.model(input_ids=ids, use_cache=False)
        hook.remove()
    jac = torch.autograd.functional.jacobian(h_final, x0["h"], vectorize=True)[:, 0]  # [i, s, j]
    return jac[:, valid].mean(1)


def test_fit_matches_brute_force_jacobian(model, prompts, tmp_path):
    out = fitting.fit(model, LLAMA_HF, prompts, cfg(tmp_path), tmp_path / "lens.pt", progress=False)
    lens = load(out)
    assert lens.n_prompts == 4 and lens.layers == [0, 1, 2]
    usable = [p for p in prompts if min(len(p), T) > SKIP + 1]
    for layer in lens.layers:
        want = torch.stack([brute_force(model._module, p, layer) for p in usable]).mean(0)
        assert (want - torch.eye(D_MODEL)).norm() > 0.5  # the test would be weak near identity
        torch.testing.assert_close(lens.J[layer], want, rtol=1e-4, atol=1e-5)


def test_saved_file_round_trips_with_provenance_and_csv(model, prompts, tmp_path):
    out = fitting.fit(model, LLAMA_HF, prompts, cfg(tmp_path, save_dtype="bfloat16"), tmp_path / "lens.pt",
                      progress=False, provenance={"model": "tiny-llama", "corpus": "random tokens"})
    lens = jlens.load(out, d_model=D_MODEL, n_layers=N_LAYERS)
    assert lens.J[0].dtype == torch.bfloat16
    p = lens.provenance
    assert p["model"] == "tiny-llama" and p["corpus"] == "random tokens"
    assert (p["T"], p["skip"], p["dim_batch"], p["dtype"], p["n_prompts"]) == (T, SKIP, 5, "float64", 4)
    assert p["converged"] is False and isinstance(p["final_delta"], float) and "hardware" in p and "date" in p
    assert p["unembedding"] == provenance.unembedding_fingerprint(model._module.get_output_embeddings().weight)
    assert p["versions"] == provenance.library_versions() and {"torch", "transformers", "nnsight"} <= set(p["versions"])
    assert "revision" not in p                    # a model built here has no hub revision
    rows = list(csv.DictReader(open(tmp_path / "lens_convergence.csv")))
    assert [r["prompt"] for r in rows] == ["1", "2", "3", "4"]
    assert float(rows[0]["delta"]) == pytest.approx(1.0) and float(rows[-1]["identity_distance"]) > 0
    assert not list(tmp_path.glob("lens*.ckpt*")), "checkpoints belong in checkpoint_dir"


def test_a_hub_model_s_revision_is_recorded(model, prompts, tmp_path, monkeypatch):
    """transformers sets `_commit_hash` on a config read from the hub: the fit records it as `revision`."""
    monkeypatch.setattr(model._module.config, "_commit_hash", "c" * 40, raising=False)
    out = fitting.fit(model, LLAMA_HF, prompts[:2], cfg(tmp_path, max_prompts=1), tmp_path / "lens.pt",
                      progress=False)
    assert jlens.read(out).provenance["revision"] == "c" * 40


def test_merge_of_halves_equals_whole(model, prompts, tmp_path):
    whole = fitting.fit(model, LLAMA_HF, prompts, cfg(tmp_path), tmp_path / "whole.pt", progress=False)
    a = fitting.fit(model, LLAMA_HF, prompts[:2], cfg(tmp_path), tmp_path / "a.pt", progress=False)
    b = fitting.fit(model, LLAMA_HF, prompts[2:], cfg(tmp_path), tmp_path / "b.pt", progress=False)
    merged = load(fitting.merge([a, b], tmp_path / "merged.pt", dtype=torch.float32))
    assert merged.n_prompts == 4 and merged.provenance["merged_from"] == ["a.pt:2", "b.pt:2"]
    for layer, m in load(whole).J.items():
        torch.testing.assert_close(merged.J[layer], m, rtol=1e-5, atol=1e-6)


def test_interrupted_fit_resumes_to_the_same_lens(model, prompts, tmp_path):
    fitting.fit(model, LLAMA_HF, prompts, cfg(tmp_path, max_prompts=2), tmp_path / "r.pt", progress=False)
    assert load(tmp_path / "r.pt").n_prompts == 2
    resumed = load(fitting.fit(model, LLAMA_HF, prompts, cfg(tmp_path), tmp_path / "r.pt", progress=False))
    straight = load(fitting.fit(model, LLAMA_HF, prompts, cfg(tmp_path / "other"), tmp_path / "s.pt", progress=False))
    assert resumed.n_prompts == straight.n_prompts == 4
    for layer in straight.layers:
        assert torch.equal(resumed.J[layer], straight.J[layer])
    assert len(list(csv.reader(open(tmp_path / "r_convergence.csv")))) == 1 + 4
    # An interim lens from the checkpoint is the same running mean.
    snap = load(fitting.snapshot(tmp_path / "snap" / "r.pt", tmp_path / "ckpt", dtype=torch.float32))
    assert snap.provenance["converged"] is False and torch.equal(snap.J[1], straight.J[1])
    assert (tmp_path / "snap" / "r_convergence.csv").read_text() == (tmp_path / "r_convergence.csv").read_text()


def test_worker_processes_fit_the_lens_one_process_fits(model, prompts, tmp_path):
    one = fitting.fit(model, LLAMA_HF, prompts, cfg(tmp_path / "1"), tmp_path / "one.pt", progress=False)
    two = fitting.fit(model, LLAMA_HF, prompts, cfg(tmp_path / "2", workers=2), tmp_path / "two.pt", progress=False,
                      load=tiny_model)
    one, two = load(one), load(two)
    assert two.n_prompts == one.n_prompts == 4 and two.provenance["workers"] == "2 processes of 1 torch thread(s)"
    for layer in one.layers:
        assert torch.equal(two.J[layer], one.J[layer])
    rows = [list(csv.reader(open(tmp_path / f"{name}_convergence.csv"))) for name in ("one", "two")]
    assert [r[:4] for r in rows[0]] == [r[:4] for r in rows[1]]           # the same deltas, prompt by prompt
    # A fit that converges with prompts still in the workers stops there, and its checkpoint resumes.
    early = fitting.fit(model, LLAMA_HF, prompts, cfg(tmp_path / "3", workers=2, min_prompts=2, threshold=10.0),
                        tmp_path / "early.pt", progress=False, load=tiny_model)
    assert load(early).n_prompts == 2
    rest = fitting.fit(model, LLAMA_HF, prompts, cfg(tmp_path / "3", workers=2), tmp_path / "early.pt",
                       progress=False, load=tiny_model)
    assert torch.equal(load(rest).J[1], one.J[1])


KILLED_FIT = """
import sys, time
from pathlib import Path
import torch
sys.path.insert(0, {tests!r})
import test_fitting as t
from lensapp import fitting
from lensapp.engine.run.families import LLAMA_HF


class Stalls(list):
    # The fit reads prompt 3 and stops there: its workers, done with prompts 0-2, wait for their next.
    def __getitem__(self, i):
        if i >= 3:
            time.sleep(3600)
        return list.__getitem__(self, i)


out = Path({out!r})
fitting.fit(t.tiny_model(), LLAMA_HF, Stalls(torch.randint(0, 100, (24,)).tolist() for _ in range(10)),
            t.cfg(out, workers=2), out / "k.pt", progress=False, load=t.tiny_model)
"""


def test_a_killed_fit_takes_its_workers_with_it(tmp_path):
    import sys
    import time

    import psutil

    script = KILLED_FIT.format(tests=str(Path(__file__).parent), out=str(tmp_path))
    fit = psutil.Popen([sys.executable, "-c", script])
    deadline, workers = time.monotonic() + 120, []
    while len(workers) < 2 and time.monotonic() < deadline and fit.poll() is None:
        time.sleep(0.5)
        workers = [c for c in fit.children() if "spawn_main" in " ".join(c.cmdline())]
    assert len(workers) == 2, "the fit never started its workers"
    time.sleep(5)                                                   # prompts 0-2 done, waiting for the next
    assert all(w.is_running() for w in workers)
    fit.kill()                                                      # no chance to shut its pool down
    fit.wait()
    def alive():        # an exited worker may wait as a zombie for a reaper that is slow here: gone all the same
        with_status = []
        for w in workers:
            try:
                with_status.append((w, w.status()))
            except psutil.NoSuchProcess:
                pass
        return [w for w, status in with_status if status != psutil.STATUS_ZOMBIE]

    deadline = time.monotonic() + 20
    while alive() and time.monotonic() < deadline:
        time.sleep(0.5)
    left = alive()
    for w in left:
        w.kill()
    assert not left, f"{len(left)} worker(s) outlived the fit"


def test_stops_when_converged(model, prompts, tmp_path):
    out = fitting.fit(model, LLAMA_HF, prompts, cfg(tmp_path, min_prompts=2, window=1, threshold=10.0),
                      tmp_path / "c.pt", progress=False)
    lens = load(out)
    assert lens.n_prompts == 2 and lens.provenance["converged"] is True


def test_checkpoint_of_another_setup_is_refused(model, prompts, tmp_path):
    fitting.fit(model, LLAMA_HF, prompts, cfg(tmp_path, max_prompts=1), tmp_path / "x.pt", progress=False)
    with pytest.raises(FitError, match="skip=4 but this run has 3"):
        fitting.fit(model, LLAMA_HF, prompts, cfg(tmp_path, skip=3), tmp_path / "x.pt", progress=False)


def test_corpus_chunks_and_holdout(tmp_path):
    chunks = corpus.load_corpus("pydoc")
    assert len(chunks) > 150 and all(c.strip() for c in chunks)
    fit_part, held = corpus.split_holdout(chunks)
    assert len(fit_part) + len(held) == len(chunks) and held[0] == chunks[9] and chunks[9] not in fit_part
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("hello\n\n\nworld\n" * 3)
    assert corpus.load_corpus(str(tmp_path / "docs"), chunk_chars=20) == ["hello\nworld\nhello\nworld", "hello\nworld"]


def test_chunks_are_cut_into_token_windows():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {w: i for i, w in enumerate("abcdefghij")}
    tok = Tokenizer(models.WordLevel(words, unk_token="a"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok)
    chunks = [" ".join("abcdefghij"), "j i h g", "a"]
    windows = corpus.token_windows(chunks, tokenizer, 4, min_tokens=2)
    assert windows == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9], [9, 8, 7, 6]]   # "a" alone is too short


@pytest.mark.parametrize("argv, message", [
    (["--corpus", "/no/such/corpus"], "no such file or folder"),
    (["--model", "/no/such/model", "--max-prompts", "1"], "cannot read its config"),
    (["--tokens", "17", "--skip", "16"], "must exceed skip + 1"),
    (["--shard", "3/2"], "--shard"),
    (["--probes", "-1"], "probes must be >= 0"),
    (["--probes", "8", "--workers", "2"], "runs with --workers 1"),
    (["--workers", "0"], "workers must be >= 1"),
    (["--snapshot", "--checkpoint-dir", "/no/such/dir"], "no checkpoint"),
])
def test_bad_input_gives_one_line_and_exit_2(argv, message, tmp_path, capsys):
    assert cli.main(["fit", *argv, "--out", str(tmp_path / "x.pt")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err


def test_merge_refuses_mismatched_d_model(tmp_path, capsys):
    jlens.save(tmp_path / "a.pt", {0: torch.eye(4)}, n_prompts=3)
    jlens.save(tmp_path / "b.pt", {0: torch.eye(8)}, n_prompts=3)
    argv = ["--merge", str(tmp_path / "a.pt"), str(tmp_path / "b.pt"), "--out", str(tmp_path / "m.pt")]
    assert cli.main(["fit", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert "d_model 8" in err and "d_model 4" in err and "\n" not in err


def test_a_fit_with_a_bos_token_reads_every_prompt_with_it_first_and_says_so(model, prompts, tmp_path):
    """As the reference `jlens` fits (force_bos=True): BOS before each prompt, and provenance["bos"]."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=model.tokenizer.backend_tokenizer, bos_token="99")
    out = fitting.fit(model, LLAMA_HF, prompts[:2], cfg(tmp_path), tmp_path / "b.pt", tokenizer=tokenizer,
                      progress=False)
    lens = load(out)
    assert lens.provenance["bos"] is True
    want = torch.stack([brute_force(model._module, [99] + p, 0) for p in prompts[:2]]).mean(0)
    torch.testing.assert_close(lens.J[0], want, rtol=1e-4, atol=1e-5)
    plain = fitting.fit(model, LLAMA_HF, prompts[:2], cfg(tmp_path / "plain"), tmp_path / "p.pt", progress=False)
    assert load(plain).provenance["bos"] is False
    assert not torch.allclose(load(plain).J[0], lens.J[0])


# -- estimator variants and resuming from a lens file ------------------------------------------------------

def exact(model, ids, **kw) -> torch.Tensor:
    return fitting.prompt_jacobian(model, LLAMA_HF, torch.tensor(ids[:T]), SKIP, 5, **kw)


def test_the_prefix_cache_and_batched_cotangents_give_the_full_backward_s_j(model, prompts):
    """Backpropagating only the valid positions (the first `skip` as a KV cache, the last dropped) and batching
    the rows through one copy's backward are the same J as every position backpropagated, copy by copy."""
    for ids in (prompts[0], prompts[3]):
        full = exact(model, ids, prefix_cache=False, batched=False)
        assert (full[1] - torch.eye(D_MODEL)).norm() > 0.5
        for kw in ({}, {"batched": False}, {"prefix_cache": False}):
            torch.testing.assert_close(exact(model, ids, **kw), full, rtol=1e-6, atol=1e-7)   # fp32 rows


def sketch(model, ids, probes, seed, control=None) -> torch.Tensor:
    return exact(model, ids, probes=probes, control=control, generator=torch.Generator().manual_seed(seed))


def test_the_sketched_estimate_is_unbiased_and_exact_with_every_probe(model, prompts):
    ids = prompts[0]
    want = exact(model, ids)
    g = torch.Generator().manual_seed(5)
    for control in (None, want + 0.3 * torch.randn(want.shape, generator=g, dtype=want.dtype)):
        draws = torch.stack([sketch(model, ids, 4, seed, control) for seed in range(120)])
        one = (draws - want).flatten(1).norm(dim=1).pow(2).mean().sqrt() / want.norm()    # one draw's rms error
        mean = (draws.mean(0) - want).norm() / want.norm()
        assert one > 0.3                         # one draw of 4 probes in 32 dims is far from J ...
        assert mean < one / 5                    # ... and 120 draws' mean closes on it (~1/sqrt(120) of one)
    noise = [(sketch(model, ids, k, 0) - want).norm() for k in (4, 16, 28)]
    assert noise[0] > noise[1] > noise[2]       # more probes, less noise


def test_a_full_set_of_orthonormal_probes_is_exact(model, prompts):
    """With k = d the probes are an orthonormal basis, Q Q^T = I: the sketch is J for any control."""
    from lensapp.fitting.estimator import jacobian_rows, prompt_graph

    ids = torch.tensor(prompts[0][:T])
    graph = prompt_graph(model, LLAMA_HF, ids, SKIP, 1)
    q, _ = torch.linalg.qr(torch.randn(D_MODEL, D_MODEL, dtype=torch.float64,
                                       generator=torch.Generator().manual_seed(0)))
    rows = jacobian_rows(graph, q.T, retain=False)                              # Q^T J, batched
    torch.testing.assert_close(q.float() @ rows, exact(model, prompts[0]), rtol=1e-5, atol=1e-5)


def test_a_sketched_fit_resumes_to_the_same_lens(model, prompts, tmp_path):
    """Prompt i's probes come from a generator seeded with i: an interrupted sketched fit resumes to the lens an
    uninterrupted one makes, and the provenance says it was sketched."""
    fitting.fit(model, LLAMA_HF, prompts, cfg(tmp_path, probes=8, max_prompts=2), tmp_path / "k.pt", progress=False)
    resumed = load(fitting.fit(model, LLAMA_HF, prompts, cfg(tmp_path, probes=8), tmp_path / "k.pt", progress=False))
    straight = load(fitting.fit(model, LLAMA_HF, prompts, cfg(tmp_path / "o", probes=8), tmp_path / "s.pt",
                                progress=False))
    assert resumed.provenance["probes"] == 8 and straight.n_prompts == 4
    assert all(torch.equal(resumed.J[layer], straight.J[layer]) for layer in straight.layers)
    exact_lens = load(fitting.fit(model, LLAMA_HF, prompts, cfg(tmp_path / "e"), tmp_path / "e.pt", progress=False))
    assert not torch.allclose(straight.J[1], exact_lens.J[1], atol=1e-3)
    with pytest.raises(FitError, match="below d_model"):
        fitting.fit(model, LLAMA_HF, prompts, cfg(tmp_path / "x", probes=D_MODEL), tmp_path / "x.pt", progress=False)


def test_a_fit_continues_a_lens_file_and_says_so(model, prompts, tmp_path):
    """resume_from: the lens's mean x n_prompts as the running sum, its CSV's rows and deltas kept, the corpus
    taken up after its prompts; the result is the lens a fit of all the prompts makes."""
    first = fitting.fit(model, LLAMA_HF, prompts, cfg(tmp_path / "a", max_prompts=2), tmp_path / "first.pt",
                        progress=False)
    cont = fitting.fit(model, LLAMA_HF, prompts, cfg(tmp_path / "b", resume_from=str(first)), tmp_path / "cont.pt",
                       progress=False)
    straight = fitting.fit(model, LLAMA_HF, prompts, cfg(tmp_path / "c"), tmp_path / "straight.pt", progress=False)
    a, b = load(cont), load(straight)
    assert a.n_prompts == b.n_prompts == 4
    for layer in b.layers:                      # the file is fp32: its mean x 2 is the sum to rounding
        torch.testing.assert_close(a.J[layer], b.J[layer], rtol=1e-5, atol=1e-6)
    r = a.provenance["resumed_from"]
    assert (r["file"], r["n_prompts"], r["dtype"]) == ("first.pt", 2, "float32") and len(r["sha256"]) == 16
    rows = list(csv.reader(open(tmp_path / "cont_convergence.csv")))
    assert rows[1:3] == list(csv.reader(open(tmp_path / "first_convergence.csv")))[1:]
    assert [r[:2] for r in rows] == [r[:2] for r in csv.reader(open(tmp_path / "straight_convergence.csv"))]
    # Interrupted after the resume, it goes on from its checkpoint, and still says where it began.
    again = fitting.fit(model, LLAMA_HF, prompts, cfg(tmp_path / "b"), tmp_path / "cont.pt", progress=False)
    assert load(again).provenance["resumed_from"] == r


def test_a_lens_of_other_prompts_is_not_continued(model, prompts, tmp_path):
    """A lens fitted without BOS cannot be continued with it: its provenance says so, or, for a file that records
    no `bos` (the shipped lens), its CSV's token counts differ from this run's prompts."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=model.tokenizer.backend_tokenizer, bos_token="99")
    plain = fitting.fit(model, LLAMA_HF, prompts, cfg(tmp_path / "a", max_prompts=2), tmp_path / "plain.pt",
                        progress=False)
    run = cfg(tmp_path / "b", resume_from=str(plain))
    with pytest.raises(FitError, match="bos=False but this run has True"):
        fitting.fit(model, LLAMA_HF, prompts, run, tmp_path / "c.pt", tokenizer=tokenizer, progress=False)
    f = jlens.read(plain)
    del f.provenance["bos"]
    jlens.save(plain, f.J, n_prompts=f.n_prompts, provenance=f.provenance, dtype=torch.float32)
    with pytest.raises(FitError, match="prompt 2 had 20 tokens, this run's has 21.*without BOS first"):
        fitting.fit(model, LLAMA_HF, prompts, run, tmp_path / "c.pt", tokenizer=tokenizer, progress=False)
    (tmp_path / "plain_convergence.csv").unlink()
    with pytest.raises(FitError, match="no convergence CSV"):
        fitting.fit(model, LLAMA_HF, prompts, run, tmp_path / "c.pt", progress=False)
    with pytest.raises(FitError, match="skip=4 but this run has 3"):
        fitting.fit(model, LLAMA_HF, prompts, cfg(tmp_path / "d", skip=3, resume_from=str(plain)), tmp_path / "d.pt",
                    progress=False)

"""The Jacobian lens shipped for the embedded model: CI loads and checks it, never fits it."""

import numpy as np
import torch
from transformers import AutoConfig

from lensapp import config, jlens, provenance
from lensapp.service import LensRequest


def test_shipped_lens_is_the_default_and_fits_the_embedded_model(embedded_dir):
    assert config.resolve_jlens(config.EngineSettings()) == str(config.SHIPPED_JLENS)
    hf = AutoConfig.from_pretrained(embedded_dir)
    from lensapp.engine.start.embedded import EMBEDDED_NAME

    lens = jlens.load(config.SHIPPED_JLENS, d_model=hf.hidden_size, n_layers=hf.num_hidden_layers,
                      model_name=EMBEDDED_NAME, unembedding=provenance.model_unembedding_fingerprint(embedded_dir))
    assert lens.warnings == []               # fitted on this model, against this unembedding
    assert lens.layers == list(range(hf.num_hidden_layers - 1))
    assert lens.n_prompts >= 10
    assert all(m.dtype == torch.bfloat16 for m in lens.J.values())
    prov = lens.provenance
    for key in ("model", "corpus", "T", "skip", "converged", "n_prompts", "unembedding"):
        assert key in prov, key
    assert prov["corpus"].startswith("general") and prov["n_prompts"] == lens.n_prompts
    # A fitted transport is no identity: it moves residuals (else the J-lens would just be the logit lens).
    assert float((lens.J[15].float() - torch.eye(hf.hidden_size)).norm()) > 1.0


def test_shipped_lens_reads_closer_to_the_final_prediction_than_the_logit_lens(vllm_service):
    """What the lens is for, where people use it: on general English held out from the fit (the held-out
    chunks of the `general` corpus it was fitted on), through the real engine, at the positions a lens
    is fitted for (after the 16 attention-sink positions), KL(final || J-lens) is below KL(final || logit
    lens) at every layer below the last."""
    from lensapp.corpus import load_corpus, split_holdout

    _, held_out = split_holdout(load_corpus("general"))
    tok = vllm_service.prompts.tokenizer
    prompts = tuple(tok.decode(tok(c)["input_ids"][:64], skip_special_tokens=True) for c in held_out[:3])
    vllm_service.load_jlens(str(config.SHIPPED_JLENS))
    try:
        results = vllm_service.lens(LensRequest(prompts=prompts, lens="both", layers="all", k=3))
    finally:
        vllm_service.install_jlens(None)
    kl = {name: np.mean([r.lenses[name].kl_to_final[:, 16:].mean(-1) for r in results], axis=0)
          for name in ("logit", "jacobian")}
    assert results[0].layers == list(range(30))
    below = kl["jacobian"][:-1] < kl["logit"][:-1]
    assert below.all(), f"J-lens KL not below the logit lens's at layers {np.flatnonzero(~below).tolist()}: {kl}"
    for r in results:   # the last layer is the target: both lenses read it identically
        assert (r.lenses["logit"].top_ids[-1] == r.lenses["jacobian"].top_ids[-1]).all()
        assert np.isfinite(r.lenses["jacobian"].top_probs).all()


def test_shipped_lens_met_the_stop_rule_on_the_corpus_it_names(embedded_dir):
    """The shipped lens is converged by the published rule (Neuronpedia's: the running mean's relative change,
    averaged over the last 10 prompts, below 2e-3, after at least 100), read from its own convergence CSV, not
    from its word; and that CSV is the record of this fit: `--resume-from` takes the lens up (the embedded model's
    unembedding, T=64, skip 16, BOS), its token counts equal to `general`'s windows with BOS, prompt by prompt."""
    import csv

    from transformers import AutoTokenizer

    from lensapp import corpus
    from lensapp.fitting.checkpoints import convergence_path, state_from_lens
    from lensapp.fitting.loop import prompt_ids
    from lensapp.fitting.settings import FitConfig

    lens = jlens.read(config.SHIPPED_JLENS)
    with open(convergence_path(config.SHIPPED_JLENS), newline="") as f:
        rows = list(csv.DictReader(f))
    rule = FitConfig()
    deltas = [float(r["delta"]) for r in rows]
    assert [int(r["prompt"]) for r in rows] == list(range(1, lens.n_prompts + 1))
    assert lens.n_prompts >= rule.min_prompts and sum(deltas[-rule.window:]) / rule.window < rule.threshold
    assert lens.provenance["converged"] is True and lens.provenance["T"] == 64 and lens.provenance["bos"] is True

    tok = AutoTokenizer.from_pretrained(embedded_dir)
    chunks, _ = corpus.split_holdout(corpus.load_corpus("general"))
    prompts = corpus.token_windows(chunks, tok, 64, min_tokens=18)
    expected = {"T": 64, "skip": 16, "bos": True,
                "unembedding": provenance.model_unembedding_fingerprint(embedded_dir)}
    state = state_from_lens(config.SHIPPED_JLENS, 30, 576, expected, n_items=len(prompts),
                            lengths=lambda i: int(prompt_ids(prompts[i], tok, 64, tok.bos_token_id).shape[0]))
    assert state.n == lens.n_prompts and state.deltas == deltas
    assert torch.allclose(state.total[15] / state.n, lens.J[15].float())

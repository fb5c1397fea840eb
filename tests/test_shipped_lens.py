"""The Jacobian lens shipped for the embedded model: CI loads and checks it, never fits it."""

from pathlib import Path

import numpy as np
import torch
from transformers import AutoConfig

from lensapp import config, jlens, provenance
from lensapp.service import LensRequest

ROOT = Path(__file__).resolve().parents[1]


def test_shipped_lens_is_the_default_and_fits_the_embedded_model(embedded_dir):
    assert config.resolve_jlens(config.Config()) == str(config.SHIPPED_JLENS)
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


# The converged lens's fit so far (docs/fitting.md, "The converged lens, in progress"): sessions here start from a
# fresh checkout, so the running mean is kept in the repository between them, for the next to continue.
FIT_SO_FAR = ROOT / "fits" / "smollm2-135m-instruct_jlens_converged.pt"


def test_the_converged_lens_s_fit_so_far_continues_where_it_stopped(embedded_dir):
    """`lensapp fit --tokens 64 --resume-from fits/...` takes it up: the embedded model's unembedding, T=64, skip 16,
    BOS, and the CSV's token counts equal to `general`'s windows with BOS, prompt by prompt."""
    from transformers import AutoTokenizer

    from lensapp import corpus
    from lensapp.fitting.checkpoints import state_from_lens
    from lensapp.fitting.loop import prompt_ids

    tok = AutoTokenizer.from_pretrained(embedded_dir)
    chunks, _ = corpus.split_holdout(corpus.load_corpus("general"))
    prompts = corpus.token_windows(chunks, tok, 64, min_tokens=18)
    expected = {"T": 64, "skip": 16, "bos": True,
                "unembedding": provenance.model_unembedding_fingerprint(embedded_dir)}
    state = state_from_lens(FIT_SO_FAR, 30, 576, expected, n_items=len(prompts),
                            lengths=lambda i: int(prompt_ids(prompts[i], tok, 64, tok.bos_token_id).shape[0]))
    lens = jlens.read(FIT_SO_FAR)
    assert state.n == lens.n_prompts >= 20 and state.cursor >= state.n and len(state.deltas) == state.n
    assert lens.provenance["converged"] is False and lens.provenance["T"] == 64
    assert torch.allclose(state.total[15] / state.n, lens.J[15].float())

"""The Jacobian lens shipped for the embedded model: CI loads and checks it, never fits it."""

import numpy as np
import torch
from transformers import AutoConfig

from lensapp import config, jlens
from lensapp.service import LensRequest


def test_shipped_lens_is_the_default_and_fits_the_embedded_model(embedded_dir):
    assert config.Config().resolved_jlens == str(config.SHIPPED_JLENS)
    hf = AutoConfig.from_pretrained(embedded_dir)
    from lensapp.engine.embedded import EMBEDDED_NAME

    lens = jlens.load(config.SHIPPED_JLENS, d_model=hf.hidden_size, n_layers=hf.num_hidden_layers,
                      model_name=EMBEDDED_NAME, unembedding=jlens.model_unembedding_fingerprint(embedded_dir))
    assert lens.warnings == []               # fitted on this model, against this unembedding
    assert lens.layers == list(range(hf.num_hidden_layers - 1))
    assert lens.n_prompts >= 10
    assert all(m.dtype == torch.bfloat16 for m in lens.J.values())
    prov = lens.provenance
    for key in ("model", "corpus", "T", "skip", "converged", "n_prompts", "unembedding"):
        assert key in prov, key
    # A fitted transport is no identity: it moves residuals (else the J-lens would just be the logit lens).
    assert float((lens.J[15].float() - torch.eye(hf.hidden_size)).norm()) > 1.0


def test_shipped_lens_reads_closer_to_the_final_prediction_than_the_logit_lens(vllm_service):
    """What the lens is for: from the middle layers on, J-lens readouts are nearer (in KL) to what the
    model finally says. Checked through the real engine on held-out corpus text the fit never saw, at
    the positions a lens is fitted for (after the 16 attention-sink positions)."""
    from lensapp.corpus import load_corpus, split_holdout

    _, held_out = split_holdout(load_corpus())
    tok = vllm_service.prompts.tokenizer
    prompts = tuple(tok.decode(tok(c)["input_ids"][:64], skip_special_tokens=True) for c in held_out[:3])
    vllm_service.load_jlens(str(config.SHIPPED_JLENS))
    try:
        results = vllm_service.lens(LensRequest(prompts=prompts, lens="both", layers="20-29", k=3))
    finally:
        vllm_service.install_jlens(None)
    kl = {name: np.mean([r.lenses[name].kl_to_final[:-1, 16:].mean() for r in results])
          for name in ("logit", "jacobian")}
    assert kl["jacobian"] < kl["logit"], kl
    for r in results:   # the last layer is the target: both lenses read it identically
        assert (r.lenses["logit"].top_ids[-1] == r.lenses["jacobian"].top_ids[-1]).all()
        assert np.isfinite(r.lenses["jacobian"].top_probs).all()

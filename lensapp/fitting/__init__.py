"""Fit Jacobian lenses for any supported transformers causal LM: J_l = E[d h_final / d h_l].

    estimator.py    one prompt's Jacobian of every layer (one forward, d_model / dim_batch backward passes)
    loop.py         the running mean over prompts and its stopping rule
    parallel.py     prompts' Jacobians from worker processes (--workers), folded in corpus order
    settings.py     FitConfig: a fit's settings, each with its help and flag (no torch)
    checkpoints.py  resuming, the convergence CSV, interim snapshots, merging shards

Method: Anthropic's reference `jlens` and Neuronpedia's fitter (see estimator.py). The command
line is `lensapp fit` (cli.py); lenses are written only through `jlens.save`.
"""

from __future__ import annotations

from ..lazy import lazy_names

# Names are imported on first use (torch with them), so the command line's parser reads FitConfig
# (settings.py, plain Python) without loading torch.
_WHERE = {"merge": "checkpoints", "snapshot": "checkpoints", "decoder_layers": "estimator",
          "prompt_jacobian": "estimator", "SAVE_DTYPES": "loop", "fit": "loop", "prompt_ids": "loop",
          "FitConfig": "settings", "FitError": "settings"}
__all__ = sorted(_WHERE)

__getattr__ = lazy_names(__name__, _WHERE)

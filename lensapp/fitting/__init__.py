"""Fit Jacobian lenses for any supported transformers causal LM: J_l = E[d h_final / d h_l].

    estimator.py    one prompt's Jacobian of every layer (one forward, d_model / dim_batch backward passes)
    loop.py         the running mean over prompts, its stopping rule, FitConfig
    checkpoints.py  resuming, the convergence CSV, interim snapshots, merging shards

Method: Anthropic's reference `jlens` and Neuronpedia's fitter (see estimator.py). The command
line is `lensapp fit` (cli.py); lenses are written only through `jlens.save`.
"""

from .checkpoints import merge, snapshot
from .estimator import FitError, decoder_layers, prompt_jacobian
from .loop import SAVE_DTYPES, FitConfig, fit, prompt_ids

__all__ = ["SAVE_DTYPES", "FitConfig", "FitError", "decoder_layers", "fit", "merge", "prompt_ids", "prompt_jacobian",
           "snapshot"]

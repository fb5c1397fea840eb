"""Settings, read once from CLI flags and environment variables into a frozen `Config`; every limit.

This is the only module that reads `os.environ`. Flags win over variables, which win over
defaults. Every variable is `LENSAPP_<FIELD>` (e.g. `LENSAPP_MODEL`), except the host and port,
which are Gradio's own `GRADIO_SERVER_NAME` / `GRADIO_SERVER_PORT`. The README's settings table is
`settings_table()`'s output (a test keeps the two equal).

Fixed limits that protect the machine (a public Space, a workshop of thirty people):
  MAX_K                   = 100    top-k per cell
  MAX_PROMPT_CHARS        = 20000  characters accepted before tokenising
  MAX_GENERATE_TOKENS     = 64     tokens per generation readout
  MAX_TEMPERATURE         = 2.0    sampling temperature
  MAX_SEED                = 2**32 - 1
  MAX_TARGETS             = 8      target strings per request
  MAX_TARGET_CHARS        = 200    characters per target
  MAX_CONTINUATION_TOKENS = 16     a longer target is scored by its first token only
  MAX_LAYERS_CHARS        = 200    characters of a layer selection
  MAX_COMPARE_PROMPTS     = 4      prompts side by side
  MAX_CHAT_MESSAGES       = 64     messages in one conversation
  MAX_ALPHA               = 20.0   a steering vector's length, in units of the layer's typical residual norm
  MAX_SWEEP               = 12     alphas in one steering request, or layers in one patch sweep
  PUNCTUATION_WIDTH       = 40     top-k the worker reads when a view skips punctuation (what it searches)
  MAX_TITLE_CHARS         = 120    a link's title
  MAX_NOTE_CHARS          = 1000   a link's note
  MAX_EXPORT_ROWS         = 200000 rows of a download (lens x layer x position x top-k entries; the JSON holds
                                   the same): ~3 s and ~18 MB of CSV to build on a small CPU
  MAX_FORCES              = 8      tokens forced in one generation (a branch of a branch of ...)
  MAX_BRANCHES            = 8      branches a page (and its link) holds beside a generation
  MAX_DESCRIBE_TOKENS     = 32     tokens of one description (Patchscopes)
and the configurable ones, with their defaults for a public CPU Space: `max_prompt_tokens`,
`max_work` (what one request may cost: service/cost.py), `max_batch`, `queue_size`, `client_requests`,
`client_parts` (one visitor's share), `request_timeout`, `stall_timeout`, `rate_limit`, `max_fit_steps`
and `max_fit_seconds` (a fitted steering vector's bounds).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import string
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from urllib.parse import urlsplit

MAX_K = 100
MAX_PROMPT_CHARS = 20_000
MAX_GENERATE_TOKENS = 64
MAX_TEMPERATURE = 2.0
MAX_SEED = 2**32 - 1
MAX_TARGETS = 8
MAX_TARGET_CHARS = 200
MAX_CONTINUATION_TOKENS = 16
MAX_LAYERS_CHARS = 200
MAX_COMPARE_PROMPTS = 4
MAX_CHAT_MESSAGES = 64
MAX_ALPHA = 20.0
MAX_SWEEP = 12
PUNCTUATION_WIDTH = 40
MAX_TITLE_CHARS = 120
MAX_NOTE_CHARS = 1000
MAX_EXPORT_ROWS = 200_000
MAX_FORCES = 8
MAX_BRANCHES = 8
MAX_DESCRIBE_TOKENS = 32
DEFAULT_MAX_MODEL_LEN = 2048       # when the model allows more (vLLM's KV cache is sized for it)
# A temperature below vLLM's own threshold decodes greedily on every backend (logits divided by 1e-73 overflow).
GREEDY_BELOW = 1e-5

# The app's tabs, by the name a link (`tab=`) and a workshop file (`tabs:`) give them.
TABS = ("logit", "jacobian", "generate", "compare", "intervene", "components")

# The lenses, and what a request's `lens` field may name.
LENSES = ("logit", "jacobian")
LENS_CHOICES = {"logit": ("logit",), "jacobian": ("jacobian",), "both": ("logit", "jacobian")}

EMBEDDED = "embedded"
PACKAGE_DIR = Path(__file__).resolve().parent
NNSIGHT_CONFIG = PACKAGE_DIR / "nnsight.yaml"
SHIPPED_JLENS = PACKAGE_DIR / "assets" / "smollm2-135m-instruct_jlens.pt"
# Published lenses for hub models we know; anything else needs --jlens.
KNOWN_JLENSES = {
    "Qwen/Qwen3-8B": "neuronpedia/jacobian-lens:qwen3-8b/jlens/Salesforce-wikitext/Qwen3-8B_jacobian_lens.pt",
}
ENV_NAMES = {"host": "GRADIO_SERVER_NAME", "port": "GRADIO_SERVER_PORT"}
MAKE_ENGINE_KEY = 'python -c "import secrets; print(secrets.token_urlsafe(32))"'


class ConfigError(ValueError):
    """A setting that cannot work; the message names the flag or variable."""


def _setting(default, help: str, *, flag: bool = True, choices: tuple = (), secret: bool = False):
    """A setting; a `secret` one is never in a repr and never taken from the command line (`ps` shows argv)."""
    return field(default=default, repr=not secret,
                 metadata={"help": help, "flag": flag, "choices": choices, "secret": secret})


@dataclass(frozen=True)
class Config:
    model: str = _setting(EMBEDDED, "`embedded` (SmolLM2-135M-Instruct, offline), a hub id, or a local folder")
    backend: str = _setting("vllm", "`vllm`, or `transformers` (nnsight `TransformersModel`, no vLLM needed)",
                            choices=("vllm", "transformers"))
    device: str = _setting("auto", "`auto`, `cpu` or `cuda`", choices=("auto", "cpu", "cuda"))
    dtype: str = _setting("auto", "`auto` is float32 on CPU (the same numbers on every CPU), bfloat16 on GPU",
                          choices=("auto", "float32", "bfloat16", "float16"))
    max_model_len: int = _setting(0, f"vLLM context length; 0 = the model's own limit, at most {DEFAULT_MAX_MODEL_LEN}")
    gpu_memory_utilization: float = _setting(0.0, "vLLM's share of GPU memory (0 = 0.85); on CPU, a share of the "
                                                  "NUMA node's memory instead of a KV cache sized from the settings")
    kv_cache_mb: int = _setting(0, "vLLM's KV cache in MB; 0 = sized from max_batch, max_prompt_tokens and the "
                                   "model (on CPU; on GPU vLLM sizes it from gpu_memory_utilization)")
    tensor_parallel_size: int = _setting(1, "GPUs one model is split across (vLLM tensor parallelism)")
    pipeline_parallel_size: int = _setting(1, "pipeline stages (vLLM; across nodes with `ray`)")
    distributed_executor_backend: str = _setting("", "vLLM's executor for several GPUs: `mp` (one node) or `ray` "
                                                     "(several); empty = vLLM's choice",
                                                 choices=("", "mp", "ray"))
    jlens: str = _setting("default", "`default` (the shipped lens / a known published one), `none`, a path, "
                                     "or `HUB_REPO:FILE`")
    jlens_layers: str = _setting("all", "which lens layers to preload: `all` or `L,L,...`")
    max_prompt_tokens: int = _setting(512, "longest prompt accepted, in tokens")
    max_work: int = _setting(24_000, "work one request may ask for, in units: cells read (tokens x layers x lenses, "
                                     "over every forward it makes) plus tokens through the model x the model's "
                                     "token weight (docs/hosting.md#limits)")
    max_batch: int = _setting(16, "engine requests run at once (vLLM batches them step by step)")
    queue_size: int = _setting(48, "requests that may wait beyond those; more are told the app is busy")
    client_requests: int = _setting(4, "requests one visitor (address) may have running or waiting; one more is "
                                       "told the app is busy (the host and loopback: unbounded)")
    client_parts: int = _setting(2, "engine requests one visitor's work holds at once (a sweep's readouts take "
                                    "turns with everyone else's)")
    part_cells: int = _setting(4096, "cells one engine request reads at most: a larger readout is cut by layers into "
                                     "parts (each re-runs the prompt's forward), so no one waits long behind it")
    request_timeout: float = _setting(120.0, "seconds a light request may take before it is cancelled; a heavier one "
                                             "gets up to five times this, in proportion to its cost")
    stall_timeout: float = _setting(120.0, "seconds the engine may go without finishing a step while work waits, "
                                           "before it is taken for stuck and restarted")
    rate_limit: int = _setting(60, "requests per minute per client address (0 = off; loopback is never limited)")
    work_per_minute: int = _setting(120_000, "engine work per minute per client address, in the units of max_work "
                                             "(a request spends what it costs when the engine starts it; a cached "
                                             "answer costs nothing), in bursts of twice max_work (0 = off; "
                                             "loopback is never limited)")
    trusted_proxies: str = _setting("auto", "proxies in front of the app whose X-Forwarded-For entry names the "
                                            "client (counted from the right); `auto` = 1 on a Hugging Face Space "
                                            "(SPACE_ID set), 0 elsewhere")
    max_fit_steps: int = _setting(200, "optimiser steps a fitted steering vector may take (0 = no fitting)")
    max_fit_seconds: float = _setting(60.0, "seconds a fitted steering vector may take")
    fitting: str = _setting("anyone", "who may fit a steering vector: `anyone`, the `host` (a logged-in visitor, "
                                      "or the machine's own users when there is no login), or `off`",
                            choices=("anyone", "host", "off"))
    fit_queue: int = _setting(2, "fits that may wait while one runs (fits run one at a time); more are told to "
                                 "come back")
    fit_threads: int = _setting(1, "torch threads of the fitter's process (a fit never takes more cores)")
    auth: str = _setting("", "`user:password[,user:password...]` asks for a login (Gradio's own); empty = open")
    health_token: str = _setting("", "a secret that shows the host all of /health (`Authorization: Bearer TOKEN`; "
                                     "the login and this machine see it too); empty = no token")
    cache_entries: int = _setting(256, "results kept for identical requests (0 = no cache)")
    cache_mb: int = _setting(256, "memory the result cache may hold, in MB")
    session_mb: int = _setting(64, "memory the visitors' pages may keep results in, all together, in MB (a page "
                                    "whose result was pushed out says to run it again)")
    sessions: int = _setting(1000, "visitors' sessions kept at once (the least recently used is forgotten first)")
    session_idle: float = _setting(900.0, "seconds a session is kept after its page last asked for anything (an open "
                                          "page asks every few seconds)")
    cache_dir: str = _setting("", "converted models and lens downloads; empty = the user cache dir "
                                  "(`/data/lensapp` when a Space has persistent storage)")
    workshop: str = _setting("", "a workshop file (YAML: title, tabs, exercises; docs/workshop.md): an Exercises "
                                 "panel, only its tabs, and counts of what was run at /workshop")
    engine_url: str = _setting("", "an engine service (`lensapp engine`) to run every readout on, e.g. "
                                   "`http://gpu-box:6677`; empty = the model runs in this process")
    engine_key: str = _setting("", "the engine service's key, at least 32 random bytes (it lets its holder run code "
                                   "on the engine): `lensapp engine` requires one, pages and commands send it; "
                                   "this variable or `engine_key_file`, never the command line", secret=True)
    engine_key_file: str = _setting("", "a file holding the engine key (instead of LENSAPP_ENGINE_KEY)")
    insecure_engine: bool = _setting(False, "allow an `http://` engine_url beyond this machine: the key and every "
                                            "answer then cross the network in clear (a private network you trust)")
    host: str = _setting("127.0.0.1", "interface to listen on")
    port: int = _setting(7860, "port to listen on")

    def __post_init__(self):
        for f in fields(self):
            choices = f.metadata.get("choices")
            if choices and getattr(self, f.name) not in choices:
                raise ConfigError(f"{f.name} must be one of {', '.join(repr(c) for c in choices)}, "
                                  f"got {getattr(self, f.name)!r}")
        for name, lo, hi in (("max_model_len", 0, 1 << 20), ("kv_cache_mb", 0, 1 << 30),
                             ("tensor_parallel_size", 1, 1024), ("pipeline_parallel_size", 1, 1024),
                             ("max_prompt_tokens", 1, 1 << 20),
                             ("max_work", 1, 1 << 40), ("max_batch", 1, 1024), ("queue_size", 0, 1 << 16),
                             ("client_requests", 1, 1 << 16), ("client_parts", 1, 1024), ("part_cells", 1, 1 << 40),
                             ("rate_limit", 0, 1 << 20), ("work_per_minute", 0, 1 << 40),
                             ("cache_entries", 0, 1 << 20), ("cache_mb", 0, 1 << 20), ("session_mb", 1, 1 << 20),
                             ("sessions", 1, 1 << 20),
                             ("max_fit_steps", 0, 100_000), ("fit_queue", 0, 1024), ("fit_threads", 1, 1024),
                             ("port", 1, 65535)):
            if not lo <= getattr(self, name) <= hi:
                raise ConfigError(f"{name} must be in {lo}..{hi}, got {getattr(self, name)}")
        if not 0.0 <= self.gpu_memory_utilization <= 1.0:
            raise ConfigError(f"gpu_memory_utilization must be in 0..1, got {self.gpu_memory_utilization}")
        if not 1.0 <= self.max_fit_seconds <= 86_400:
            raise ConfigError(f"max_fit_seconds must be in 1..86400 seconds, got {self.max_fit_seconds}")
        for name in ("request_timeout", "stall_timeout", "session_idle"):
            if not 1.0 <= getattr(self, name) <= 86_400:
                raise ConfigError(f"{name} must be in 1..86400 seconds, got {getattr(self, name)}")
        if self.trusted_proxies not in ("auto", *map(str, range(9))):
            raise ConfigError(f"trusted_proxies must be 'auto' or a number of proxies 0..8, "
                              f"got {self.trusted_proxies!r}")
        if self.max_model_len and self.max_prompt_tokens + MAX_GENERATE_TOKENS > self.max_model_len:
            raise ConfigError(f"max_prompt_tokens ({self.max_prompt_tokens}) + {MAX_GENERATE_TOKENS} generated "
                              f"must fit max_model_len ({self.max_model_len})")
        if self.engine_url and not self.engine_url.startswith(("http://", "https://")):
            raise ConfigError(f"engine_url must be an http:// or https:// address, got {self.engine_url!r}")
        if self.engine_key_file:
            object.__setattr__(self, "engine_key", _key_from_file(self.engine_key_file, self.engine_key))
        if self.engine_url:
            check_engine_key(self.engine_key)
            host = urlsplit(self.engine_url).hostname or ""
            if self.engine_url.startswith("http://") and not is_loopback_host(host) and not self.insecure_engine:
                raise ConfigError(f"engine_url {self.engine_url} is plain http beyond this machine, so the key and "
                                  "every answer would cross the network in clear: use https:// (a TLS proxy in front "
                                  "of the engine) or an SSH tunnel to a loopback port, or --insecure-engine on a "
                                  "network you trust")
        _ = self.auth_pairs       # raises ConfigError when malformed

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
        # float32 on CPU, so a readout is the same on every CPU a Space may land on: CPUs without bf16
        # units run bf16 ~3x slower, while one with AVX512-BF16 (this project's VM at times) runs the
        # head's matmul 4x faster in bf16. `--dtype bfloat16` is the choice to make there, knowingly.
        return "bfloat16" if self.resolved_device == "cuda" else "float32"

    @property
    def resolved_cache_dir(self) -> Path:
        if self.cache_dir:
            return Path(self.cache_dir).expanduser()
        # A Hugging Face Space with persistent storage mounts it at /data: caches there outlive restarts.
        if Path("/data").is_dir() and os.access("/data", os.W_OK) and os.environ.get("SPACE_ID"):
            return Path("/data/lensapp")
        import platformdirs

        return Path(platformdirs.user_cache_dir("lensapp"))

    @property
    def resolved_trusted_proxies(self) -> int:
        """How many proxies' X-Forwarded-For entries to count back from the right (`service/identity.py`)."""
        if self.trusted_proxies != "auto":
            return int(self.trusted_proxies)
        return 1 if os.environ.get("SPACE_ID") else 0      # a Space's own front end appends one entry

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

    @property
    def auth_pairs(self) -> list[tuple[str, str]]:
        """`auth` as Gradio's list of (user, password) pairs; empty when the app is open."""
        pairs = []
        for item in filter(None, (p.strip() for p in self.auth.split(","))):
            user, sep, password = item.partition(":")
            if not sep or not user or not password:
                raise ConfigError("auth must be user:password pairs separated by commas")
            pairs.append((user, password))
        return pairs


def check_engine_key(key: str) -> None:
    """ConfigError unless `key` can hold 32 random bytes. Text cannot show that a key is random, only that it is
    long enough for 256 bits in the alphabet it uses, 64 hex digits (4 bits each), 43 base64 characters (6 bits:
    `secrets.token_urlsafe(32)`) or 40 of any printable ASCII (6.55 bits), and not visibly patterned: 12 different
    characters at least, which a random key of those lengths lacks with a chance under 1e-6 ("aaaa..." does)."""
    if not key:
        raise ConfigError(f"an engine service runs code sent to it: give it and its pages a key "
                          f"({env_name('engine_key')} or --engine-key-file); make one with {MAKE_ENGINE_KEY}")
    printable = set(string.printable) - set(string.whitespace)
    alphabet = next((n for chars, n in ((string.hexdigits, 64), (string.ascii_letters + string.digits + "-_+/=", 43),
                                        (printable, 40)) if set(key) <= set(chars)), None)
    if alphabet is None:
        raise ConfigError(f"the engine key must be printable ASCII without spaces (it travels in a header): "
                          f"make one with {MAKE_ENGINE_KEY}")
    if len(key) < alphabet or len(set(key)) < 12:
        raise ConfigError(f"the engine key is too short or too plain to be 32 random bytes ({len(key)} characters; "
                          f"it takes 43 of base64, 64 hex digits or 40 other characters): make one with "
                          f"{MAKE_ENGINE_KEY}")


def _key_from_file(path: str, given: str) -> str:
    try:
        key = Path(path).expanduser().read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"engine_key_file {path}: {getattr(e, 'strerror', None) or e}") from None
    if given and given != key:       # (equal: a Config replace()d from one that read the file)
        raise ConfigError(f"the engine key is given twice ({env_name('engine_key')} and --engine-key-file): keep one")
    return key


def is_loopback_host(host: str) -> bool:
    """Whether `host` (a URL's or a listening address's) names this machine only."""
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_int_list(text: str, what: str) -> list[int]:
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise ConfigError(f"{what} must be 'all' or comma-separated integers, got {text!r}") from None


def env_name(name: str) -> str:
    return ENV_NAMES.get(name, f"LENSAPP_{name.upper()}")


def add_arguments(parser: argparse.ArgumentParser, names: tuple[str, ...] | None = None) -> None:
    """A flag for each setting (or those in `names`); defaults come from the environment, then Config."""
    for f in fields(Config):
        if names is not None and f.name not in names:
            continue
        kind, flag = type(f.default), f"--{f.name.replace('_', '-')}"
        help = f"{f.metadata['help'].replace('%', '%%')} [env {env_name(f.name)}]"
        if f.metadata["secret"]:            # taken, to be refused in one line (from_args) without echoing it
            parser.add_argument(flag, default=None, help=argparse.SUPPRESS)
        elif kind is bool:
            parser.add_argument(flag, action="store_true", default=None, help=help)
        else:
            parser.add_argument(flag, type=kind, default=None, choices=list(f.metadata["choices"]) or None, help=help)


ENGINE_SETTINGS = ("model", "backend", "device", "dtype", "max_model_len", "gpu_memory_utilization", "kv_cache_mb",
                   "tensor_parallel_size", "pipeline_parallel_size", "distributed_executor_backend", "jlens",
                   "jlens_layers", "max_prompt_tokens", "max_work", "cache_dir", "max_fit_steps", "max_fit_seconds",
                   "fitting", "fit_threads", "engine_url", "engine_key", "engine_key_file", "insecure_engine")


def from_args(args: argparse.Namespace | None = None, environ: dict | None = None) -> Config:
    """Build the one Config: flags, then LENSAPP_* variables, then defaults."""
    env = os.environ if environ is None else environ
    values = {}
    for f in fields(Config):
        flag = getattr(args, f.name, None) if args is not None else None
        if flag is not None and f.metadata["secret"]:
            raise ConfigError(f"the {f.name.replace('_', ' ')} is not taken on the command line, where `ps` shows it "
                              f"to everyone on this machine: set {env_name(f.name)}, or put it in a file named by "
                              f"--{f.name.replace('_', '-')}-file")
        if flag is not None:
            values[f.name] = flag
            continue
        var = env_name(f.name)
        if env.get(var):
            try:
                values[f.name] = _from_text(type(f.default), env[var])
            except (ValueError, KeyError):
                raise ConfigError(f"{var}={env[var]!r} is not a valid {type(f.default).__name__}") from None
    return Config(**values)


def _from_text(kind: type, text: str):
    if kind is bool:
        return {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}[text.strip().lower()]
    return kind(text)


def settings_table() -> str:
    """The README's settings table, from the fields above."""
    rows = ["| variable | flag | default | meaning |", "| --- | --- | --- | --- |"]
    for f in fields(Config):
        default = f"`{f.default}`" if f.default != "" else "(empty)"
        flag = "(none: never argv)" if f.metadata["secret"] else f"`--{f.name.replace('_', '-')}`"
        rows.append(f"| `{env_name(f.name)}` | {flag} | {default} | {f.metadata['help']} |")
    return "\n".join(rows)


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

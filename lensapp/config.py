"""Settings, read once from CLI flags and environment variables into a frozen `Config`; every limit.

This is the only module that reads `os.environ`. Flags win over variables, which win over
defaults. Every variable is `LENSAPP_<FIELD>` (e.g. `LENSAPP_MODEL`), except the host and port,
which are Gradio's own `GRADIO_SERVER_NAME` / `GRADIO_SERVER_PORT`. The README's settings table is
`settings_table()`'s output (a test keeps the two equal).

The settings are declared by concern in settings.py (the engine, the limits, fitting, the web app, a
workshop, an engine service, the secrets); `Config` holds them nested by concern (`cfg.engine.model`), and
each part of the app is handed its own concern's part.
What a setting resolves to on this machine looks at torch, the filesystem or the environment, so it is
a function here, not a property: `resolve_device`, `resolve_dtype`, `resolve_cache_dir`,
`resolve_trusted_proxies`, `resolve_jlens`.

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
  MAX_CHAT_MESSAGES       = 64     messages of a conversation the model reads (the latest turns; the answer
                                   says how many older ones it left out)
  MAX_CHAT_SENT           = 1024   messages one request may send
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
import dataclasses
import ipaddress
import itertools
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from urllib.parse import urlsplit

from .settings import (
    DEFAULT_MAX_MODEL_LEN,
    EMBEDDED,
    ConfigError,
    EngineSettings,
    LimitSettings,
    RemoteEngineSettings,
    Secrets,
    SteeringFitSettings,
    WebSettings,
    WorkshopSettings,
    check_engine_key,
    checked_names,
    env_name,
    names_of,
)

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
MAX_CHAT_SENT = 1024
MAX_ALPHA = 20.0
MAX_SWEEP = 12
PUNCTUATION_WIDTH = 40
MAX_TITLE_CHARS = 120
MAX_NOTE_CHARS = 1000
MAX_EXPORT_ROWS = 200_000
MAX_FORCES = 8
MAX_BRANCHES = 8
MAX_DESCRIBE_TOKENS = 32
# A temperature below vLLM's own threshold decodes greedily on every backend (logits divided by 1e-73 overflow).
GREEDY_BELOW = 1e-5

# The app's tabs, by the name a link (`tab=`) and a workshop file (`tabs:`) give them.
TABS = ("logit", "jacobian", "generate", "compare", "intervene", "components")

PACKAGE_DIR = Path(__file__).resolve().parent
NNSIGHT_CONFIG = PACKAGE_DIR / "nnsight.yaml"
SHIPPED_JLENS = PACKAGE_DIR / "assets" / "smollm2-135m-instruct_jlens.pt"
# Published lenses for hub models we know; anything else needs --jlens.
KNOWN_JLENSES = {
    "Qwen/Qwen3-8B": "neuronpedia/jacobian-lens:qwen3-8b/jlens/Salesforce-wikitext/Qwen3-8B_jacobian_lens.pt",
}


@dataclass(frozen=True)
class Config:
    """Every setting, nested by concern as vLLM's `VllmConfig` is (`cfg.engine.model`, `cfg.web.port`), so that each
    part of the app is handed its own concern's settings only. The parts come in `settings.CONCERNS`'s order (the
    settings table's); `Config.of(model=...)` and `replace(cfg, max_batch=2)` name settings flat, as flags do."""

    engine: EngineSettings = field(default_factory=EngineSettings)
    limits: LimitSettings = field(default_factory=LimitSettings)
    fits: SteeringFitSettings = field(default_factory=SteeringFitSettings)
    web: WebSettings = field(default_factory=WebSettings)
    workshop: WorkshopSettings = field(default_factory=WorkshopSettings)
    remote: RemoteEngineSettings = field(default_factory=RemoteEngineSettings)
    secrets: Secrets = field(default_factory=Secrets)

    def __post_init__(self):
        engine, limits, remote = self.engine, self.limits, self.remote
        if engine.max_model_len and limits.max_prompt_tokens + MAX_GENERATE_TOKENS > engine.max_model_len:
            raise ConfigError(f"max_prompt_tokens ({limits.max_prompt_tokens}) + {MAX_GENERATE_TOKENS} generated "
                              f"must fit max_model_len ({engine.max_model_len})")
        if remote.engine_key_file:
            key = read_engine_key(remote.engine_key_file, self.secrets.engine_key)
            object.__setattr__(self, "secrets", dataclasses.replace(self.secrets, engine_key=key))
        if remote.engine_url:
            check_engine_key(self.secrets.engine_key)
            for url in remote.engine_urls:
                host = urlsplit(url).hostname or ""
                if url.startswith("http://") and not is_loopback_host(host) and not remote.insecure_engine:
                    raise ConfigError(f"engine_url {url} is plain http beyond this machine, so the key and every "
                                      "answer would cross the network in clear: use https:// (a TLS proxy in front "
                                      "of the engine) or an SSH tunnel to a loopback port, or --insecure-engine on a "
                                      "network you trust")

    @classmethod
    def of(cls, **values) -> Config:
        """The Config with these settings, named flat as flags name them (`Config.of(model="gpt2", max_batch=2)`)."""
        return replace(cls(), **values)


# Each part of a Config by its name (`limits`), in the settings table's order; the part holding each setting.
PARTS = {f.name: f.default_factory for f in fields(Config)}
PART_OF = {setting.name: part for part, concern in PARTS.items() for setting in fields(concern)}
# Every setting's declaration, flat, in the settings table's order: what flags, variables and the table are made of.
SETTING_FIELDS = tuple(setting for concern in PARTS.values() for setting in fields(concern))


def requests_at_once(cfg: Config) -> int:
    """Engine requests a page runs at once: `max_batch` on each engine it runs on (its own, or each of
    `engine_url`'s services), so the page tells a visitor it is busy only when every engine is."""
    return cfg.limits.max_batch * max(1, len(cfg.remote.engine_urls))


def replace(cfg: Config, **values) -> Config:
    """`cfg` with the settings named flat changed (`replace(cfg, max_batch=2)`), each in its concern's part; a
    name no concern declares is a TypeError, as a dataclass's unknown field is."""
    unknown = [name for name in values if name not in PART_OF]
    if unknown:
        raise TypeError(f"no setting named {', '.join(map(repr, unknown))}")
    changed = {part: dataclasses.replace(getattr(cfg, part), **{n: v for n, v in values.items() if PART_OF[n] == part})
               for part in PARTS if part in {PART_OF[name] for name in values}}
    return dataclasses.replace(cfg, **changed)


def value_of(cfg: Config, name: str):
    """The setting named `name` (flat, as its flag names it), from the part that holds it."""
    return getattr(getattr(cfg, PART_OF[name]), name)


def read_engine_key(path: str, given: str) -> str:
    """The key in `engine_key_file`; ConfigError when it cannot be read, or when another key was given too."""
    try:
        key = Path(path).expanduser().read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"engine_key_file {path}: {getattr(e, 'strerror', None) or e}") from None
    if given and given != key:       # (equal: a Config replace()d from one that read the file)
        raise ConfigError(f"the engine key is given twice ({env_name('engine_key')} and --engine-key-file): keep one")
    return key


def greedy(temperature: float) -> bool:
    """The one greedy rule (`GREEDY_BELOW`): the engine's `Sampling`, a request's `sampled` and the cache read it."""
    return temperature < GREEDY_BELOW


def is_loopback_host(host: str) -> bool:
    """Whether `host` (a URL's or a listening address's) names this machine only."""
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# -- what a setting resolves to on this machine (each looks at it: torch, the filesystem, the environment) ------

def resolve_device(settings: EngineSettings) -> str:
    if settings.device != "auto":
        return settings.device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_dtype(settings: EngineSettings) -> str:
    if settings.dtype != "auto":
        return settings.dtype
    # float32 on CPU, so a readout is the same on every CPU a Space may land on: CPUs without bf16
    # units run bf16 ~3x slower, while one with AVX512-BF16 (this project's VM at times) runs the
    # head's matmul 4x faster in bf16. `--dtype bfloat16` is the choice to make there, knowingly.
    return "bfloat16" if resolve_device(settings) == "cuda" else "float32"


def resolve_cache_dir(settings: EngineSettings) -> Path:
    if settings.cache_dir:
        return Path(settings.cache_dir).expanduser()
    # A Hugging Face Space with persistent storage mounts it at /data: caches there outlive restarts.
    if Path("/data").is_dir() and os.access("/data", os.W_OK) and os.environ.get("SPACE_ID"):
        return Path("/data/lensapp")
    import platformdirs

    return Path(platformdirs.user_cache_dir("lensapp"))


def resolve_trusted_proxies(settings: WebSettings) -> int:
    """How many proxies' X-Forwarded-For entries to count back from the right (`service/identity.py`)."""
    if settings.trusted_proxies != "auto":
        return int(settings.trusted_proxies)
    return 1 if os.environ.get("SPACE_ID") else 0      # a Space's own front end appends one entry


def resolve_jlens(settings: EngineSettings) -> str | None:
    """The lens file to preload, or None."""
    if settings.jlens == "none":
        return None
    if settings.jlens != "default":
        return settings.jlens
    if settings.model == EMBEDDED:
        return str(SHIPPED_JLENS) if SHIPPED_JLENS.exists() else None
    return KNOWN_JLENSES.get(settings.model)


# -- flags and variables ---------------------------------------------------------------------------------------

# What a command that runs the model takes (cli.py's request commands; the engine service's start from it): the
# engine's, an engine service's and fitting's settings, the key, and what one request may ask for.
ENGINE_SETTINGS = (*names_of(EngineSettings, RemoteEngineSettings, SteeringFitSettings),
                   *checked_names("engine_key", "max_prompt_tokens", "max_work"))


def add_arguments(parser: argparse.ArgumentParser, names: tuple[str, ...] | None = None) -> None:
    """A flag for each setting (or those in `names`: a misspelled one raises); defaults come from the environment,
    then Config."""
    chosen = None if names is None else set(checked_names(*names))
    for f in SETTING_FIELDS:
        if chosen is not None and f.name not in chosen:
            continue
        kind, flag = type(f.default), f"--{f.name.replace('_', '-')}"
        help = f"{f.metadata['help'].replace('%', '%%')} [env {env_name(f.name)}]"
        if not f.metadata["argv"]:          # taken, to be refused in one line (from_args) without echoing it
            parser.add_argument(flag, default=None, help=argparse.SUPPRESS)
        elif kind is bool:
            parser.add_argument(flag, action="store_true", default=None, help=help)
        else:
            parser.add_argument(flag, type=kind, default=None, choices=list(f.metadata["choices"]) or None, help=help)


def refuse_secret_flags(argv: list[str], aliases: tuple[tuple[str, str], ...] = ()) -> None:
    """Refuse a secret's flag (`--engine-key`, or an `aliases` flag naming a setting) before argparse reads argv:
    a key that starts with '-' (1 in 64 of secrets.token_urlsafe's) is not a value to argparse, which would say
    "expected one argument" and not why. from_args refuses the same flags again once they are parsed."""
    flags = {f"--{f.name.replace('_', '-')}": f.name for f in SETTING_FIELDS if not f.metadata["argv"]}
    flags.update(aliases)
    for arg in itertools.takewhile(lambda a: a != "--", argv):
        if (name := flags.get(arg.split("=", 1)[0])) is not None:
            raise _not_on_command_line(name)


def _not_on_command_line(name: str) -> ConfigError:
    return ConfigError(f"the {name.replace('_', ' ')} is not taken on the command line, where `ps` shows it to "
                       f"everyone on this machine: set {env_name(name)}, or put it in a file named by "
                       f"--{name.replace('_', '-')}-file")


def from_args(args: argparse.Namespace | None = None, environ: dict | None = None) -> Config:
    """Build the one Config: flags, then LENSAPP_* variables, then defaults."""
    env = os.environ if environ is None else environ
    values = {}
    for f in SETTING_FIELDS:
        flag = getattr(args, f.name, None) if args is not None else None
        if flag is not None and not f.metadata["argv"]:
            raise _not_on_command_line(f.name)
        if flag is not None:
            values[f.name] = flag
            continue
        var = env_name(f.name)
        if env.get(var):
            try:
                values[f.name] = _from_text(type(f.default), env[var])
            except (ValueError, KeyError):
                raise ConfigError(f"{var}={env[var]!r} is not a valid {type(f.default).__name__}") from None
    return Config.of(**values)


def _from_text(kind: type, text: str):
    if kind is bool:
        return {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}[text.strip().lower()]
    return kind(text)


def settings_table() -> str:
    """The README's settings table, from the fields above."""
    rows = ["| variable | flag | default | meaning |", "| --- | --- | --- | --- |"]
    for f in SETTING_FIELDS:
        default = f"`{f.default}`" if f.default != "" else "(empty)"
        flag = "(none: never argv)" if not f.metadata["argv"] else f"`--{f.name.replace('_', '-')}`"
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


__all__ = ["DEFAULT_MAX_MODEL_LEN", "EMBEDDED", "Config", "ConfigError", "EngineSettings", "LimitSettings",
           "RemoteEngineSettings", "Secrets", "SteeringFitSettings", "WebSettings", "WorkshopSettings",
           "add_arguments", "check_engine_key", "env_name", "from_args", "prepare_process_environment",
           "refuse_secret_flags", "replace", "value_of"]

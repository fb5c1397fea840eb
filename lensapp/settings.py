"""The settings, declared once, by concern: a frozen dataclass each for the engine, the limits that protect the
machine, fitting steering vectors, the web app, a workshop, an engine service to run on, and the secrets.

Each field carries its help, its choices or bounds, and whether the command line may carry it; `config.Config`
holds one of each, nested (`cfg.engine.model`, `cfg.web.port`), and config.py reads them from flags and the
environment (this module reads nothing). Each part of the app is handed its own concern's settings. A secret is
never in a repr; `engine_key` is never taken from argv either.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field, fields

EMBEDDED = "embedded"
DEFAULT_MAX_MODEL_LEN = 2048       # when the model allows more (vLLM's KV cache is sized for it)
ENV_NAMES = {"host": "GRADIO_SERVER_NAME", "port": "GRADIO_SERVER_PORT"}
MAKE_ENGINE_KEY = 'python -c "import secrets; print(secrets.token_urlsafe(32))"'


class ConfigError(ValueError):
    """A setting that cannot work; the message names the flag or variable."""


def setting(default, help: str, *, choices: tuple = (), bounds: tuple | None = None, unit: str = "",
            secret: bool = False, argv: bool = True):
    """A setting: its default and help, the values it may take (`choices`, or `bounds` lo..hi in `unit`s); a
    `secret` is never in a repr, and one not taken from `argv` never on the command line (`ps` shows argv)."""
    return field(default=default, repr=not secret,
                 metadata={"help": help, "choices": choices, "bounds": bounds, "unit": unit, "argv": argv})


def check(settings, concern: type) -> None:
    """ConfigError for the first of `concern`'s fields whose value on `settings` is outside its choices or bounds."""
    for f in fields(concern):
        value, choices, bounds = getattr(settings, f.name), f.metadata["choices"], f.metadata["bounds"]
        if choices and value not in choices:
            raise ConfigError(f"{f.name} must be one of {', '.join(repr(c) for c in choices)}, got {value!r}")
        if bounds and not bounds[0] <= value <= bounds[1]:
            unit = f" {f.metadata['unit']}" if f.metadata["unit"] else ""
            raise ConfigError(f"{f.name} must be in {bounds[0]}..{bounds[1]}{unit}, got {value}")


@dataclass(frozen=True)
class EngineSettings:
    """What loads the model and its Jacobian lens, on what, and where downloads go."""

    model: str = setting(EMBEDDED, "`embedded` (SmolLM2-135M-Instruct, offline), a hub id, or a local folder")
    backend: str = setting("vllm", "`vllm`, or `transformers` (nnsight `TransformersModel`, no vLLM needed)",
                           choices=("vllm", "transformers"))
    device: str = setting("auto", "`auto`, `cpu` or `cuda`", choices=("auto", "cpu", "cuda"))
    dtype: str = setting("auto", "`auto` is float32 on CPU (the same numbers on every CPU), bfloat16 on GPU",
                         choices=("auto", "float32", "bfloat16", "float16"))
    max_model_len: int = setting(0, f"vLLM context length; 0 = the model's own limit, at most {DEFAULT_MAX_MODEL_LEN}",
                                 bounds=(0, 1 << 20))
    gpu_memory_utilization: float = setting(0.0, "vLLM's share of GPU memory (0 = 0.85); on CPU, a share of the "
                                                 "NUMA node's memory instead of a KV cache sized from the settings",
                                            bounds=(0, 1))
    kv_cache_mb: int = setting(0, "vLLM's KV cache in MB; 0 = sized from max_batch, max_prompt_tokens and the "
                                  "model (on CPU; on GPU vLLM sizes it from gpu_memory_utilization)",
                               bounds=(0, 1 << 30))
    tensor_parallel_size: int = setting(1, "GPUs one model is split across (vLLM tensor parallelism)", bounds=(1, 1024))
    pipeline_parallel_size: int = setting(1, "pipeline stages (vLLM; across nodes with `ray`)", bounds=(1, 1024))
    distributed_executor_backend: str = setting("", "vLLM's executor for several GPUs: `mp` (one node) or `ray` "
                                                    "(several); empty = vLLM's choice", choices=("", "mp", "ray"))
    jlens: str = setting("default", "`default` (the shipped lens / a known published one), `none`, a path, "
                                    "or `HUB_REPO:FILE`")
    jlens_layers: str = setting("all", "which lens layers to preload: `all` or `L,L,...`")
    cache_dir: str = setting("", "converted models and lens downloads; empty = the user cache dir "
                                 "(`/data/lensapp` when a Space has persistent storage)")

    def __post_init__(self):
        check(self, EngineSettings)

    @property
    def jlens_layer_list(self) -> list[int] | None:
        return None if self.jlens_layers.strip() == "all" else parse_int_list(self.jlens_layers, "jlens_layers")


@dataclass(frozen=True)
class LimitSettings:
    """What one request may ask for, and how the engine's time is shared between visitors."""

    max_prompt_tokens: int = setting(512, "longest prompt accepted, in tokens", bounds=(1, 1 << 20))
    max_work: int = setting(24_000, "work one request may ask for, in units: cells read (tokens x layers x lenses, "
                                    "over every forward it makes) plus tokens through the model x the model's "
                                    "token weight (docs/hosting.md#limits)", bounds=(1, 1 << 40))
    max_batch: int = setting(16, "engine requests run at once (vLLM batches them step by step); with engine_url, on "
                                 "each engine; in `lensapp engine`, its traces in flight past which a page's pool is "
                                 "told at once that it is full (429) and asks another engine", bounds=(1, 1024))
    queue_size: int = setting(48, "requests that may wait beyond those; more are told the app is busy",
                              bounds=(0, 1 << 16))
    client_requests: int = setting(4, "requests one visitor (address) may have running or waiting; one more is "
                                      "told the app is busy (the host and loopback: unbounded)", bounds=(1, 1 << 16))
    client_parts: int = setting(2, "engine requests one visitor's work holds at once (a sweep's readouts take "
                                   "turns with everyone else's)", bounds=(1, 1024))
    part_cells: int = setting(4096, "cells one engine request reads at most: a larger readout is cut by layers into "
                                    "parts (each re-runs the prompt's forward), so no one waits long behind it",
                              bounds=(1, 1 << 40))
    request_timeout: float = setting(120.0, "seconds a light request may take before it is cancelled; a heavier one "
                                            "gets up to five times this, in proportion to its cost",
                                     bounds=(1, 86_400), unit="seconds")
    stall_timeout: float = setting(120.0, "seconds the engine may go without finishing a step while work waits, "
                                          "before it is taken for stuck and restarted",
                                   bounds=(1, 86_400), unit="seconds")
    rate_limit: int = setting(60, "requests per minute per client address (0 = off; loopback is never limited)",
                              bounds=(0, 1 << 20))
    work_per_minute: int = setting(120_000, "engine work per minute per client address, in the units of max_work "
                                            "(a request spends what it costs when the engine starts it; a cached "
                                            "answer costs nothing), in bursts of twice max_work (0 = off; "
                                            "loopback is never limited)", bounds=(0, 1 << 40))
    fit_queue: int = setting(2, "fits that may wait while one runs (fits run one at a time); more are told to "
                                "come back", bounds=(0, 1024))

    def __post_init__(self):
        check(self, LimitSettings)


@dataclass(frozen=True)
class SteeringFitSettings:
    """Fitting a steering vector against a lens (service/fits.py; a lens's own fit is fitting/settings.py's)."""

    max_fit_steps: int = setting(200, "optimiser steps a fitted steering vector may take (0 = no fitting)",
                                 bounds=(0, 100_000))
    max_fit_seconds: float = setting(60.0, "seconds a fitted steering vector may take", bounds=(1, 86_400),
                                     unit="seconds")
    fitting: str = setting("anyone", "who may fit a steering vector: `anyone`, the `host` (a logged-in visitor, "
                                     "or the machine's own users when there is no login), or `off`",
                           choices=("anyone", "host", "off"))
    fit_threads: int = setting(1, "torch threads of the fitter's process (a fit never takes more cores)",
                               bounds=(1, 1024))

    def __post_init__(self):
        check(self, SteeringFitSettings)


@dataclass(frozen=True)
class WebSettings:
    """The web app: who its visitors are behind proxies, what it keeps for them, where it listens."""

    trusted_proxies: str = setting("auto", "proxies in front of the app whose X-Forwarded-For entry names the "
                                           "client (counted from the right); `auto` = 1 on a Hugging Face Space "
                                           "(SPACE_ID set), 0 elsewhere")
    cache_entries: int = setting(256, "results kept for identical requests (0 = no cache)", bounds=(0, 1 << 20))
    cache_mb: int = setting(256, "memory the result cache may hold, in MB", bounds=(0, 1 << 20))
    session_mb: int = setting(64, "memory the visitors' pages may keep results in, all together, in MB (a page "
                                   "whose result was let go makes it again from its recipe)", bounds=(1, 1 << 20))
    sessions: int = setting(1000, "visitors' sessions kept at once (the least recently used is forgotten first)",
                            bounds=(1, 1 << 20))
    session_idle: float = setting(900.0, "seconds a session is kept after its page last asked for anything (an open "
                                         "page asks every few seconds)", bounds=(1, 86_400), unit="seconds")
    host: str = setting("127.0.0.1", "interface to listen on")
    port: int = setting(7860, "port to listen on", bounds=(1, 65535))

    def __post_init__(self):
        check(self, WebSettings)
        if self.trusted_proxies not in ("auto", *map(str, range(9))):
            raise ConfigError(f"trusted_proxies must be 'auto' or a number of proxies 0..8, "
                              f"got {self.trusted_proxies!r}")


@dataclass(frozen=True)
class WorkshopSettings:
    """A workshop's file: its exercises, the tabs it shows, and counts of what was run (workshop.py)."""

    workshop: str = setting("", "a workshop file (YAML: title, tabs, exercises; docs/workshop.md): an Exercises "
                                "panel, only its tabs, and counts of what was run at /workshop")

    def __post_init__(self):
        check(self, WorkshopSettings)


@dataclass(frozen=True)
class RemoteEngineSettings:
    """An engine service (`lensapp engine`) this process runs every readout on instead of its own model."""

    engine_url: str = setting("", "engine services (`lensapp engine`) to run every readout on, one or a comma list "
                                  "(`http://gpu-a:6677,http://gpu-b:6677`: each request to the one with the fewest in "
                                  "flight, moved to another when one is full or gone); empty = the model runs in this "
                                  "process")
    engine_key_file: str = setting("", "a file holding the engine key (instead of LENSAPP_ENGINE_KEY)")
    insecure_engine: bool = setting(False, "allow an `http://` engine_url beyond this machine: the key and every "
                                           "answer then cross the network in clear (a private network you trust)")

    def __post_init__(self):
        check(self, RemoteEngineSettings)
        urls = self.engine_urls
        for url in urls:
            if not url.startswith(("http://", "https://")) or not url.split("://", 1)[1].strip("/"):
                raise ConfigError(f"engine_url must be http:// or https:// addresses separated by commas; "
                                  f"{url or 'an empty entry'!r} is not one")
        if len(set(urls)) < len(urls):
            raise ConfigError(f"engine_url names an engine twice ({self.engine_url!r})")

    @property
    def engine_urls(self) -> tuple[str, ...]:
        """The engine services `engine_url` lists (its comma list, each entry stripped; an empty one kept, for
        `__post_init__` to name)."""
        if not self.engine_url.strip():
            return ()
        return tuple(url.strip().rstrip("/") for url in self.engine_url.split(","))


@dataclass(frozen=True)
class Secrets:
    """The app's login, /health's token and the engine service's key: never in a repr."""

    auth: str = setting("", "`user:password[,user:password...]` asks for a login (Gradio's own); empty = open",
                        secret=True)
    health_token: str = setting("", "a secret that shows the host all of /health (`Authorization: Bearer TOKEN`; "
                                    "the login and this machine see it too); empty = no token", secret=True)
    engine_key: str = setting("", "the engine service's key, at least 32 random bytes (it lets its holder run code "
                                  "on the engine): `lensapp engine` requires one, pages and commands send it; "
                                  "this variable or `engine_key_file`, never the command line", secret=True, argv=False)

    def __post_init__(self):
        check(self, Secrets)
        _ = self.auth_pairs       # raises ConfigError when malformed

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


# The concerns, in the order of the settings table and of `lensapp serve --help`.
CONCERNS = (EngineSettings, LimitSettings, SteeringFitSettings, WebSettings, WorkshopSettings, RemoteEngineSettings,
            Secrets)


def names_of(*concerns: type) -> tuple[str, ...]:
    return tuple(f.name for concern in concerns for f in fields(concern))


def checked_names(*names: str) -> tuple[str, ...]:
    """`names`, each a setting's: a misspelled one raises here (at import, for a module's list), never skipped."""
    unknown = [n for n in names if n not in names_of(*CONCERNS)]
    if unknown:
        raise ValueError(f"no setting named {', '.join(map(repr, unknown))}: settings are the fields of "
                         f"lensapp/settings.py's {', '.join(c.__name__ for c in CONCERNS)}")
    return names


def env_name(name: str) -> str:
    return ENV_NAMES.get(name, f"LENSAPP_{name.upper()}")


def parse_int_list(text: str, what: str) -> list[int]:
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise ConfigError(f"{what} must be 'all' or comma-separated integers, got {text!r}") from None


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

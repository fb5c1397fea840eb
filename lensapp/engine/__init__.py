"""The engine core: the one owner of the model (core.py), its backends and what they deal in.

Token ids in, small tensors out; nothing here knows text, results or the UI (see protocol.py).
"""

from .core import Engine, EngineBusy, EngineDown, EngineError, EngineRestarted, EngineTimeout
from .loading import ModelError, ResolvedModel, describe_model, resolve_model
from .protocol import Backend, ModelInfo

__all__ = ["Backend", "Engine", "EngineBusy", "EngineDown", "EngineError", "EngineRestarted", "EngineTimeout",
           "ModelError", "ModelInfo", "ResolvedModel", "describe_model", "resolve_model"]

"""The engine: the one owner of the model (see engine.py), its backends and request types."""

from .backends import ModelInfo
from ..results import ChatReply
from .engine import Engine, resolve_model
from .requests import GenerateRequest, LensRequest, RequestError

__all__ = ["ChatReply", "Engine", "GenerateRequest", "LensRequest", "ModelInfo", "RequestError", "resolve_model"]

"""The service layer: text and settings in, `results` objects out (see service.py).

The CLI, the API and the tabs call `LensService`; it tokenises, plans and validates requests,
runs them through the engine core (`lensapp.engine`) and assembles results.
"""

from .requests import ChatRequest, GenerateRequest, InterveneRequest, LensRequest, RequestError
from .service import LensService

__all__ = ["ChatRequest", "GenerateRequest", "InterveneRequest", "LensRequest", "LensService", "RequestError"]

"""The service layer: text and settings in, `results` objects out (see service.py).

The CLI, the API and the tabs call `LensService`; it tokenises, plans and validates requests,
runs them through the engine core (`lensapp.engine`) and assembles results.

Names are imported on first use, not with the package: `lensapp serve` reads its settings and
request fields (`service.fields`, plain Python) and answers its first page before torch is loaded.
"""

from __future__ import annotations

import importlib

_WHERE = {"ChatRequest": "requests", "GenerateRequest": "requests", "InterveneRequest": "requests",
          "LensRequest": "requests", "RequestError": "field", "LensService": "service"}
__all__ = ["ChatRequest", "GenerateRequest", "InterveneRequest", "LensRequest", "LensService", "RequestError"]


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value
    return value

"""The service layer: text and settings in, `results` objects out (see service.py).

The CLI, the API and the tabs call `LensService`; it tokenises, plans and validates requests,
runs them through the engine core (`lensapp.engine`) and assembles results.

Names are imported on first use, not with the package: `lensapp serve` reads its settings and
request fields (`service.fields`, plain Python) and answers its first page before torch is loaded.
"""

from __future__ import annotations

from ..lazy import lazy_names

_WHERE = {"ChatRequest": "requests", "GenerateRequest": "requests", "InterveneRequest": "requests",
          "LensRequest": "requests", "RequestError": "field", "LensService": "service",
          "ComponentsRequest": "requests", "DescribeRequest": "requests"}
__all__ = ["ChatRequest", "ComponentsRequest", "DescribeRequest", "GenerateRequest", "InterveneRequest", "LensRequest",
           "LensService",
           "RequestError"]

__getattr__ = lazy_names(__name__, _WHERE)

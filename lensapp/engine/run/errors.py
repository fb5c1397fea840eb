"""What the engine tells a caller that it could not serve: one line each, meant for the user."""

from __future__ import annotations


class EngineError(RuntimeError):
    """The engine could not serve a request; the message is one line meant for the user."""


class EngineBusy(EngineError):
    pass


class EngineRestarted(EngineError):
    pass


class EngineDown(EngineError):
    pass


class EngineTimeout(EngineError):
    pass

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


def one_line(e: BaseException) -> str:
    """An exception in one line for a log or a message: its type and its message's first line."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__

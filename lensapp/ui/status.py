"""The engine's state on the page: a line under the header while the model loads, restarts, is busy or is
down, and the run buttons enabled only while it can serve. Polled from the service's health."""

from __future__ import annotations

from .. import redact
from .tabs import md_text

POLL_SECONDS = 2.0


def status_line(health: dict) -> str:
    """One line of Markdown for the page's status banner ('' when all is well)."""
    state = health.get("state")
    reason = md_text(redact.paths(health.get("reason") or "unknown"))
    if state == "starting":
        waiting = f" Meanwhile: {md_text(health['reason'])}." if health.get("reason") else ""   # e.g. its service
        return ("⏳ **The model is loading** (vLLM starts and warms up; about a minute on a small CPU). "
                f"The buttons wake up when it is ready; a readout asked for now runs then.{waiting}")
    if state == "restarting":
        return ("⚠️ **The model is restarting** after a failure "
                f"({reason}). Requests in progress were stopped: run them again "
                "once it is back; new ones wait for it.")
    if state == "down":
        return f"⛔ **The model is down**: {reason}. Try again later."
    waiting = int(health.get("queue_depth") or 0)
    if waiting:
        return f"⌛ Busy: {waiting} request{'s' if waiting != 1 else ''} waiting; yours will run in turn."
    return ""


def is_ready(health: dict) -> bool:
    return health.get("state") == "ready"

"""What Gradio keeps for each visitor's session, bounded: how many sessions, how long, and how much each holds.

Gradio (6.x) keeps a `SessionState` per session id for as long as it has room for 10,000 of them, and a closed
page's `gr.State` values for an hour. Besides those values, each session keeps its own copy of every component's
config and of the last value every output showed (`SessionState.config_values`: a long lens's heatmap spec,
tables and code, megabytes a visit), which only Gradio's "deep links" read (`/gradio_api/deep_link`, a route that
also writes a file of them to disk for anyone who names a session). This app shows neither (its links are its own:
`permalinks.py`), so `install` puts in Gradio's place:

- `LeanSession`: a session that keeps no copy of its components' values (their props are still kept: a
  dropdown's choices, a hidden button shown);
- `LeanSessions`: at most `capacity` sessions (least recently used out first), and a session unused for
  `idle_seconds` (its page closed: an open page polls the engine's status every few seconds) dropped whole;
  either way the handles it holds in the kept store are given back (`kept.py`: `on_drop`, its session id), and its
  states' delete callbacks run;
- the deep-link route removed.

A session's own cost is then at most `memory.SESSION_BYTES` (its copy of the blocks' and events' tables, its
states' handles), and the memory plan (`engine/start/memory.py`) counts `capacity` of them.

This reaches into Gradio's session store (gradio/state_holder.py, pinned where the app is deployed: pyproject's
`cpu` and `gpu` extras): `mend_problem` says at start whether the installed Gradio still takes it (`/health`'s
`mends`), and docs/upstream/gradio-session-config-copy.md is the change that would make it unneeded.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from gradio.state_holder import SessionState, StateHolder

log = logging.getLogger(__name__)

DEEP_LINK_PATH = "/gradio_api/deep_link"
CLOSED_STATE_SECONDS = 600           # a closed page's states (Gradio: an hour); the session goes when idle


class LeanSession(SessionState):
    """A session that keeps its components' props but no copy of the values they last showed.

    Gradio's own `__init__` runs, handed the page as `_Unlisted` shows it: with no block to copy the config of, it
    skips the per-block copy (`config_values`), which cost 540 KB and ~0.1 s of CPU for every new session of this
    page, and sets everything else as it does. Whether this Gradio still takes that is `mend_problem`'s question."""

    def __init__(self, blocks):
        super().__init__(_Unlisted(blocks))
        self.STATE_TTL_WHEN_CLOSED = CLOSED_STATE_SECONDS

    def _update_value_in_config(self, key: int, value) -> None:
        pass

    def _update_config(self, key: int) -> None:
        pass


class _Unlisted:
    """The page as `SessionState.__init__` is handed it by `LeanSession`: itself, but for its blocks (none listed:
    Gradio 6.21-6.31 copies the config of each block `blocks.blocks` lists)."""

    def __init__(self, blocks):
        self._page = blocks
        self.blocks: dict = {}

    def __getattr__(self, name: str):
        return getattr(self._page, name)


# What LeanSession and LeanSessions reach into, besides `SessionState.__init__`'s reading of `blocks.blocks`: the
# methods that would copy a block's config again (overridden to do nothing), what a session is made with (the closed
# page's states' time to live among it) and the store's parts.
_SESSION_COPIES = ("_update_value_in_config", "_update_config", "state_components")
_SESSION_PARTS = ("blocks_config", "config_values", "state_data", "STATE_TTL_WHEN_CLOSED")
_STORE_PARTS = ("session_data", "time_last_used", "lock", "capacity")


def mend_problem(gradio_app) -> str | None:
    """None where the installed Gradio takes what `install` put in its place on `gradio_app` (the lean session made
    by Gradio's own `__init__` with no block's config copied, what it overrides still Gradio's, the store the app and
    its page read, the deep-link route gone); else what differs, in one line. Asked at start (`ui/mends.py`)."""
    blocks = gradio_app.get_blocks()
    try:
        lean, made, store = LeanSession(blocks), vars(SessionState(_Unlisted(blocks))), vars(StateHolder())
    except Exception as e:  # noqa: BLE001 - any failure is the answer: this Gradio's session is another shape
        return f"a lean session cannot be made ({type(e).__name__}: {e})"
    if lean.config_values:
        return f"SessionState.__init__ copied {len(lean.config_values)} blocks' config (not from blocks.blocks)"
    missing = [name for name in _SESSION_COPIES if not hasattr(SessionState, name)]
    missing += [name for name in _SESSION_PARTS if name not in made]
    missing += [name for name in _STORE_PARTS if name not in store]
    if missing:
        return f"Gradio's sessions have no {', '.join(missing)}"
    holder = getattr(gradio_app, "state_holder", None)
    if not isinstance(holder, LeanSessions) or getattr(blocks, "state_holder", None) is not holder:
        return "the app's session store is not the lean one (Gradio reads it elsewhere)"
    if not holder.deep_link_removed:
        return f"Gradio has no route {DEEP_LINK_PATH} to remove"
    return None


class LeanSessions(StateHolder):
    """Gradio's session store with a bound on sessions and on how long an unused one is kept."""

    def __init__(self, capacity: int, idle_seconds: float, clock=time.monotonic,
                 on_drop: Callable[[str], None] | None = None):
        super().__init__()
        self.idle_seconds, self.clock, self.on_drop = idle_seconds, clock, on_drop
        self._capacity = capacity
        self._used: dict[str, float] = {}
        self.dropped = 0
        self.deep_link_removed = False       # set by `install`

    def set_blocks(self, blocks) -> None:
        super().set_blocks(blocks)
        self.capacity = self._capacity           # Gradio's own setting would put it back to 10,000

    def __getitem__(self, session_id: str) -> SessionState:
        if session_id not in self.session_data:
            with self.lock:
                self.session_data.setdefault(session_id, LeanSession(self.blocks))
        self._used[session_id] = self.clock()
        return super().__getitem__(session_id)

    def update(self, session_id: str) -> None:
        evicted = []
        with self.lock:
            if session_id in self.session_data:
                self.session_data.move_to_end(session_id)
            while len(self.session_data) > self.capacity:
                evicted.append(self._pop(next(iter(self.session_data))))
        for session_id, session in evicted:
            self._give_back(session_id, session)

    def delete_all_expired_state(self) -> None:
        """Gradio's sweep (every second): expired states, then every session unused for `idle_seconds`."""
        super().delete_all_expired_state()
        now = self.clock()
        with self.lock:
            idle = [sid for sid in self.session_data if now - self._used.get(sid, now) > self.idle_seconds]
            gone = [self._pop(sid) for sid in idle]
        for session_id, session in gone:
            self._give_back(session_id, session)

    def _pop(self, session_id: str) -> tuple[str, SessionState]:
        """Forget a session (the lock held)."""
        self.time_last_used.pop(session_id, None)
        self._used.pop(session_id, None)
        self.dropped += 1
        return session_id, self.session_data.pop(session_id)

    def _give_back(self, session_id: str, session: SessionState) -> None:
        """Run the session's states' delete callbacks, and give its kept handles back (`on_drop`)."""
        for component, value, _ in list(session.state_components):
            try:
                component.delete_callback(value)
            except Exception:  # noqa: BLE001 - one state's callback must not keep the others
                log.exception("a session state's delete callback failed")
        if self.on_drop is not None:
            self.on_drop(session_id)


def install(fastapi_app, capacity: int, idle_seconds: float,
            on_drop: Callable[[str], None] | None = None) -> LeanSessions:
    """Put `LeanSessions` in the mounted Gradio app's place and remove its deep-link route; returns the store.
    `on_drop(session_id)`: called when a session is dropped (the kept store gives back its handles)."""
    gradio_app = mounted(fastapi_app)
    sessions = LeanSessions(capacity, idle_seconds, on_drop=on_drop)
    sessions.set_blocks(gradio_app.get_blocks())
    gradio_app.state_holder = sessions
    routes = gradio_app.router.routes
    kept = [r for r in routes if getattr(r, "path", "") != DEEP_LINK_PATH]
    sessions.deep_link_removed = len(kept) < len(routes)
    routes[:] = kept
    return sessions


def mounted(fastapi_app):
    """The Gradio app `gr.mount_gradio_app` mounted on `fastapi_app`."""
    return next(route.app for route in fastapi_app.routes if hasattr(getattr(route, "app", None), "state_holder"))

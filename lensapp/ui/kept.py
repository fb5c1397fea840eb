"""What a visitor's page keeps between events: a small handle in Gradio's session state, and the result it names in
one store that every session shares, bounded in bytes.

Gradio keeps a session's `gr.State` for an hour after its page is closed (`sessions.py` shortens that). The tabs
used to keep whole result objects there: thirty visitors who each opened a long link and left grew the web process
by 1.1 GB, linearly (bench/RESULTS.md). Now a tab's state is a kept state (`kept_state`): on the page it holds a
handle (a short random string); `tabs.on` hands each handler the value the handle names and keeps what a handler
writes, so the handlers deal in results as before. The store (`KeptResults`) is a least-recently-used map of
handles to values, bounded by bytes (`Config.session_mb`) and by handles, counting a value once however many pages
show it (the front page's examples are on every page). A value written over, or whose session is gone, is dropped
at once.

A handle whose value was evicted (the page sat idle while many others were used) reads as `Expired`: the visitor is
told, in one line, to run the readout again; their inputs are still on the page.
"""

from __future__ import annotations

import contextlib
import contextvars
import secrets
import threading
import weakref
from collections import OrderedDict
from typing import Any, Callable, Iterator

import gradio as gr

from ..service.cache import approx_bytes
from ..service.field import RequestError

MAX_HANDLES = 100_000            # ~15 MB of handles at most, whatever the values
PREFIX = "kept:"
_BUILDING: contextvars.ContextVar[KeptResults | None] = contextvars.ContextVar("kept_results", default=None)
_KEPT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()      # kept state -> (its store, its empty value)


class Expired(RequestError):
    """A page's result is no longer kept on the server."""

    def __init__(self):
        super().__init__("this page's last result is no longer kept on the server (it keeps the most recent ones): "
                         "run it again")


class KeptResults:
    """Values by handle: least recently used first out once over `max_bytes` (each distinct value counted once)."""

    def __init__(self, max_bytes: int, size: Callable[[Any], int] = approx_bytes, max_handles: int = MAX_HANDLES):
        self.max_bytes, self.size, self.max_handles = max_bytes, size, max_handles
        self._handles: OrderedDict[str, int] = OrderedDict()        # handle -> id of its value
        self._values: dict[int, list] = {}                          # id -> [value, bytes, handles naming it]
        self._lock = threading.Lock()
        self.bytes = 0
        self.expired = 0            # reads of a handle no longer kept
        self.evicted = 0            # handles let go to stay within the bounds

    def keep(self, value) -> str | None:
        """A new handle for `value` (None for None: nothing to keep)."""
        if value is None:
            return None
        size = self.size(value)                  # outside the lock: sizing a large result takes a while
        handle = PREFIX + secrets.token_urlsafe(12)
        with self._lock:
            entry = self._values.get(id(value))
            if entry is None or entry[0] is not value:
                entry = self._values[id(value)] = [value, size, 0]
                self.bytes += size
            entry[2] += 1
            self._handles[handle] = id(value)
            self._evict()
        return handle

    def get(self, handle: str | None, empty=None):
        """The value `handle` names (`empty` for None); Expired when it is no longer kept."""
        if handle is None:
            return empty
        with self._lock:
            key = self._handles.get(handle) if isinstance(handle, str) else None
            if key is None:
                self.expired += 1
                raise Expired()
            self._handles.move_to_end(handle)
            return self._values[key][0]

    def drop(self, handle: str | None) -> None:
        """Forget `handle` (its session is gone, or its value was written over); never raises."""
        if not isinstance(handle, str):
            return
        with self._lock:
            self._forget(handle)

    def stats(self) -> dict:
        with self._lock:
            return {"handles": len(self._handles), "values": len(self._values), "bytes": self.bytes,
                    "max_bytes": self.max_bytes, "expired": self.expired, "evicted": self.evicted}

    def _evict(self) -> None:
        while self._handles and (self.bytes > self.max_bytes or len(self._handles) > self.max_handles):
            self._forget(next(iter(self._handles)))
            self.evicted += 1

    def _forget(self, handle: str) -> None:
        key = self._handles.pop(handle, None)
        if key is None:
            return
        entry = self._values[key]
        entry[2] -= 1
        if entry[2] == 0:
            del self._values[key]
            self.bytes -= entry[1]


@contextlib.contextmanager
def building(store: KeptResults) -> Iterator[KeptResults]:
    """The kept states made in this block (a page's tabs, as `build_ui` makes them) keep their values in `store`."""
    token = _BUILDING.set(store)
    try:
        yield store
    finally:
        _BUILDING.reset(token)


def kept_state(empty=None) -> gr.State:
    """A `gr.State` that holds a handle on the page, into the store of the page being built (`building`); `tabs.on`
    (and `downloads`) read and write the value through it (`read`, `write`). `empty`: what a handler reads before
    anything was kept (a branch list's `[]`). A plain State, marked here: a subclass of a Gradio component would be
    taken for a custom component (Gradio writes a stub file beside its module, and the page asks for its script)."""
    store = _BUILDING.get()
    if store is None:
        raise RuntimeError("a kept state is made while a page is built: inside `with kept.building(store):`")
    state = gr.State(None, delete_callback=store.drop)
    _KEPT[state] = (store, empty)
    return state


def is_kept(component) -> bool:
    return isinstance(component, gr.State) and component in _KEPT


def read(component: gr.State, handle):
    """The value a kept state's handle names (its `empty` for none); Expired when it is no longer kept."""
    store, empty = _KEPT[component]
    return store.get(handle, empty)


def write(component: gr.State, value, old=None) -> str | None:
    """The handle a kept state holds for `value` from now on; the handle it held before (`old`) is dropped."""
    store, _ = _KEPT[component]
    handle = store.keep(value)
    if old is not None and old != handle:
        store.drop(old)
    return handle

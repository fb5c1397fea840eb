"""What a visitor's page keeps between events: on the page, a handle and the recipe of its result; on the server,
the result the handle names, in one store every page shares, bounded in bytes, fair between pages.

Gradio keeps a session's `gr.State` on the server, and drops it with the session (`sessions.py` bounds them): a
page whose session was dropped read nothing, and did not know it. So a tab's state is a kept state (`kept_state`):
a hidden component whose value lives in the browser and comes with every event, `{"h": handle, "r": recipe}`. The
recipe is JSON (the request that made the result, `Kept`); `tabs.on` hands each handler the value the handle
names and keeps what a handler writes, so the handlers deal in results as before.

The store (`KeptResults`) is a cache, not the visitor's data: over its bound it lets go of the least recently used
value of the page that holds the most (a value shown on many pages, such as the front page's examples, counts once
in the total and in full for each page holding it), and a value larger than half the bound is not kept at all.
So one heavy reader evicts its own results, never another page's small ones. A page whose value was let go has it
made again from its recipe (`keep_in(page, store, remake)`: a result-cache hit, or a readout charged to that page) and
kept under the same handle; only a value without a recipe reads as `Expired` (run it again).
"""

from __future__ import annotations

import secrets
import threading
import weakref
from collections import OrderedDict, defaultdict
from dataclasses import dataclass, replace
from typing import Any, Callable

import gradio as gr

from ..service import parsers
from ..service.cache import approx_bytes
from ..service.field import RequestError
from ..service.kinds import KINDS
from .views import CHAINS

MAX_HANDLES = 100_000            # ~15 MB of handles at most, whatever the values
PREFIX = "kept:"
_KEPT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()      # kept state -> its Slot (no store until `keep_in`)


class Expired(RequestError):
    """A page's result is no longer kept on the server, and the page has no recipe to make it again."""

    def __init__(self):
        super().__init__("this page's last result is no longer kept on the server (it keeps the most recent ones): "
                         "run it again")


@dataclass(frozen=True)
class Kept:
    """What a handler writes to a kept state: the value, and the recipe that makes it again (JSON; its kept
    state's `remake` reads it). A handler may write a bare value: it reads as `Expired` once let go."""

    value: Any
    recipe: Any = None


class KeptResults:
    """Values by handle, each handle held by one owner (a page's session); over `max_bytes` (each distinct value
    counted once) or `max_handles`, the owner holding the most lets go of its least recently used handle."""

    def __init__(self, max_bytes: int, size: Callable[[Any], int] = approx_bytes, max_handles: int = MAX_HANDLES):
        self.max_bytes, self.size, self.max_handles = max_bytes, size, max_handles
        self._handles: dict[str, tuple[str, int]] = {}                # handle -> (owner, id of its value)
        self._by_owner: dict[str, OrderedDict[str, None]] = {}      # owner -> its handles, least recently used first
        self._held: dict[str, dict[int, int]] = {}                  # owner -> value id -> handles of its naming it
        self._charged: dict[str, int] = defaultdict(int)            # owner -> bytes of the values it holds
        self._values: dict[int, list] = {}                          # id -> [value, bytes, handles naming it]
        self._lock = threading.Lock()
        self.bytes = 0
        self.expired = 0            # reads of a handle no longer kept
        self.evicted = 0            # handles let go to stay within the bounds
        self.too_large = 0          # values not kept: larger than the whole bound

    def keep(self, value, owner: str = "", handle: str | None = None) -> str | None:
        """A handle for `value` held by `owner` (`handle`: keep it under that one, made again); None for None."""
        if value is None:
            return None
        size = self.size(value)                  # outside the lock: sizing a large result takes a while
        handle = handle or PREFIX + secrets.token_urlsafe(12)
        with self._lock:
            self._forget(handle)
            if size > self.max_bytes // 2:       # kept, it would push out other pages' results, or be pushed out
                self.too_large += 1              # itself at their next result (and made again at its page's next)
                return handle
            entry = self._values.get(id(value))
            if entry is None or entry[0] is not value:
                entry = self._values[id(value)] = [value, size, 0]
                self.bytes += size
            entry[2] += 1
            self._handles[handle] = (owner, id(value))
            self._by_owner.setdefault(owner, OrderedDict())[handle] = None
            held = self._held.setdefault(owner, {})
            held[id(value)] = held.get(id(value), 0) + 1
            if held[id(value)] == 1:
                self._charged[owner] += size
            self._evict()
        return handle

    def get(self, handle: str | None, empty=None):
        """The value `handle` names (`empty` for None); Expired when it is not kept."""
        if handle is None:
            return empty
        with self._lock:
            named = self._handles.get(handle) if isinstance(handle, str) else None
            if named is None:
                self.expired += 1
                raise Expired()
            self._by_owner[named[0]].move_to_end(handle)
            return self._values[named[1]][0]

    def retire(self, handle: str | None) -> None:
        """`handle`'s value was written over: first to go when its owner must let go of something, but still there
        for an event the page sent before it heard of the new one (a state's change starts several listeners at
        once: one writing the state while another reads the handle it replaces)."""
        if isinstance(handle, str):
            with self._lock:
                named = self._handles.get(handle)
                if named is not None:
                    self._by_owner[named[0]].move_to_end(handle, last=False)

    def drop(self, handle: str | None) -> None:
        """Forget `handle` (its value was written over); never raises."""
        if isinstance(handle, str):
            with self._lock:
                self._forget(handle)

    def drop_owner(self, owner: str) -> None:
        """Forget every handle `owner` holds (its session is gone)."""
        with self._lock:
            for handle in list(self._by_owner.get(owner, ())):
                self._forget(handle)

    def stats(self) -> dict:
        with self._lock:
            return {"handles": len(self._handles), "values": len(self._values), "bytes": self.bytes,
                    "max_bytes": self.max_bytes, "owners": len(self._by_owner), "expired": self.expired,
                    "evicted": self.evicted, "too_large": self.too_large}

    def _evict(self) -> None:
        while self._handles and (self.bytes > self.max_bytes or len(self._handles) > self.max_handles):
            by_bytes = self.bytes > self.max_bytes
            owner = max(self._by_owner, key=lambda o: self._charged[o] if by_bytes else len(self._by_owner[o]))
            self._forget(next(iter(self._by_owner[owner])))
            self.evicted += 1

    def _forget(self, handle: str) -> None:
        named = self._handles.pop(handle, None)
        if named is None:
            return
        owner, key = named
        entry = self._values[key]
        handles = self._by_owner[owner]
        del handles[handle]
        held = self._held[owner]
        held[key] -= 1
        if held[key] == 0:
            del held[key]
            self._charged[owner] -= entry[1]
        if not handles:
            del self._by_owner[owner], self._held[owner], self._charged[owner]
        entry[2] -= 1
        if entry[2] == 0:
            del self._values[key]
            self.bytes -= entry[1]


@dataclass(frozen=True)
class Slot:
    """A kept state's store, what it reads before anything was kept, and how a recipe makes its value again
    (`remake(recipe, request) -> value`, charged to the page asking; None: it cannot be made again). The store is
    None from `kept_state` until `keep_in` names the page's."""

    store: KeptResults | None
    empty: Any = None
    remake: Callable[[Any, Any], Any] | None = None


def kept_state(empty=None) -> gr.JSON:
    """A hidden component whose value, kept by the browser, names a result and its recipe; `tabs.on` (and
    `downloads`) read and write the result through it (`read`, `write`) once `keep_in` has given its page's store.
    `empty`: what a handler reads before anything was kept (a branch list's `[]`)."""
    state = gr.JSON(None, visible="hidden", show_label=False, elem_classes=["kept-state"])
    _KEPT[state] = Slot(None, empty)
    return state


def keep_in(page: gr.Blocks, store: KeptResults, remake: Callable[[Any, Any], Any] | None = None) -> KeptResults:
    """Every kept state of `page` (a page's tabs, as `build_ui` made them) keeps its values in `store` and makes
    them again with `remake` (`remaker`) from the recipe a handler wrote with its value (`Kept`)."""
    for block in page.blocks.values():
        if is_kept(block):
            _KEPT[block] = replace(_KEPT[block], store=store, remake=remake)
    return store


def is_kept(component) -> bool:
    return component in _KEPT if isinstance(component, gr.JSON) else False


def owner_of(request) -> str:
    """Whose handles a request's writes are: its page's session ("" outside a page, as in tests)."""
    return str(getattr(request, "session_hash", None) or "")


def read(component: gr.JSON, page_value, request=None):
    """The value a kept state's page value names (its `empty` for none), made again from its recipe when the
    store let it go; a one-line error (run it again) when it cannot be."""
    slot = _slot(component)
    handle, recipe = _parts(page_value)
    if handle is None:
        return slot.empty
    try:
        return slot.store.get(handle)
    except Expired as e:
        if recipe is None or slot.remake is None:
            raise gr.Error(str(e), title="Run it again", print_exception=False) from None
    value = slot.remake(recipe, request)
    slot.store.keep(value, owner_of(request), handle=handle)
    return value


def write(component: gr.JSON, value, old=None, request=None) -> dict | None:
    """The page value a kept state holds for `value` (a `Kept`, or a bare value) from now on; the handle it held
    before (`old`) is retired (its owner's first to go)."""
    slot = _slot(component)
    value, recipe = (value.value, value.recipe) if isinstance(value, Kept) else (value, None)
    old_handle, _ = _parts(old)
    handle = slot.store.keep(value, owner_of(request))
    if old_handle is not None and old_handle != handle:
        slot.store.retire(old_handle)
    return None if handle is None else {"h": handle, "r": recipe}


def _slot(component: gr.JSON) -> Slot:
    slot = _KEPT[component]
    if slot.store is None:
        raise RuntimeError("a kept state is used before its page's store is given: `kept.keep_in(page, store)`")
    return slot


# -- recipes: what makes a kept value again ----------------------------------------------------------------------

def recipe(kind: str, req, shape: str = "result", forces: list | None = None, read_from: int = 0) -> dict:
    """The recipe of a value made from `req`, a request of `kind` (service/kinds.py), by `shape`: "result" (its
    answer), "request" (the request itself), "pair" ((request, answer)), "branches" (one answer per chain of
    forced tokens in `forces`). `read_from`: a lens readout's first look, read from that position (its page
    completes it next: ui/lens_tab.py)."""
    out = {"kind": kind, "request": req.to_raw(), "as": shape}
    if read_from:
        out["read_from"] = read_from
    return out if forces is None else {**out, "forces": [[list(x) for x in chain] for chain in forces]}


def remaker(service, guard) -> Callable[[Any, Any], Any]:
    """A kept state's `remake` for recipes made by `recipe`: the value made again through `guard` (charged to the
    page asking, as a readout of its own would be; a request needs no engine and is not charged)."""
    def remake(made_by, request):
        kind, req, shape, chains = _recipe_parts(made_by)
        if shape == "request":
            return req
        return guard.ui(request, _made, service, kind, req, made_by, chains)
    return remake


def _recipe_parts(made_by) -> tuple:
    """(kind, request, shape, branches) of a recipe the page sent, each read by the rule its request's is (a
    "branches" recipe's forces as the page's link carries them: `views.CHAINS`, MAX_BRANCHES chains of MAX_FORCES
    token ids at most); Expired for anything else (a recipe it was not given)."""
    try:
        kind = KINDS[made_by["kind"]]
        req = kind.request.parse(**made_by["request"])
        shape = made_by.get("as", "result")
        read_from = made_by.get("read_from", 0)
        if type(read_from) is not int or read_from < 0:
            raise ValueError(read_from)
        chains = CHAINS(parsers.branches_text(made_by.get("forces") or [])) if shape == "branches" else ()
    except (KeyError, TypeError, ValueError, AttributeError, RequestError):
        raise gr.Error(str(Expired()), title="Run it again", print_exception=False) from None
    if shape not in ("result", "request", "pair", "branches") or getattr(req, "sampled", False) and req.seed is None:
        raise gr.Error(str(Expired()), title="Run it again", print_exception=False)    # a sample never drawn again
    return kind, req, shape, chains


def _made(service, kind, req, made_by, chains: tuple = ()):
    if made_by["as"] == "branches":
        return [kind.answered(kind.run(service, replace(req, force=chain))) for chain in chains]
    if made_by.get("read_from"):              # a first look stays one: its page's next event completes it
        return service.lens(req, read_from=made_by["read_from"])[0]
    answer = kind.answered(kind.run(service, req))
    return (req, answer) if made_by["as"] == "pair" else answer


def _parts(page_value) -> tuple[str | None, Any]:
    """(handle, recipe) of a page value; a value the page was not given (tampered with) names nothing kept."""
    if page_value is None:
        return None, None
    if isinstance(page_value, dict) and isinstance(page_value.get("h"), str):
        return page_value["h"], page_value.get("r")
    return "", None          # not a handle: reads as Expired, never as someone else's value


def value_of(written):
    """What a handler wrote, without its recipe (a `Kept`'s value; anything else as it is): how a test or a caller
    outside `tabs.on` reads a handler's answer as the next handler would."""
    return written.value if isinstance(written, Kept) else written

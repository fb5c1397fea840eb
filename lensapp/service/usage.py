"""What was run in a workshop, counted without personal data.

With a workshop file the service reports each request to `Usage.record` (its observer): a count per
tab, per layer read and per prompt length (in characters, bucketed), and the Exercises panel counts
each exercise opened. No prompt, address or other text is kept unless the host's file says
`record_prompts: true`; then the last `MAX_PROMPTS` prompts are kept with their tab (never an address).
`/workshop` serves `to_json()` to the host (behind the login when one is set); `/health` the counts.
The front page's examples, drawn on every visit (`ui/front.py`), are asked with `counted=False` (asks.py): they are
nobody's choice; the service tells the observer of counted requests only.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque

from ..lens_kinds import read_by, reads_jlens
from .field import RequestError
from .selection import Selection

MAX_PROMPTS = 1000
# Prompt lengths in characters: the upper bound of each bucket (the last one is open).
LENGTH_BUCKETS = (20, 50, 100, 200, 500)


def length_bucket(n: int) -> str:
    low = 0
    for high in LENGTH_BUCKETS:
        if n < high:
            return f"{low}-{high - 1}"
        low = high
    return f"{low}+"


def tab_of(kind: str, req) -> str:
    """The tab a request of this kind is made from (the API makes the same requests)."""
    if kind == "lens":
        return "jacobian" if reads_jlens(read_by(req.lens)) else "logit"       # the tab that reads it
    return {"chat": "generate", "describe": "logit"}.get(kind, kind)       # a cell is described from a lens


class Usage:
    def __init__(self, n_layers: int, exercises: list[str], record_prompts: bool = False):
        self.n_layers = n_layers
        self.exercise_titles = list(exercises)
        self.record_prompts = record_prompts
        self._lock = threading.Lock()
        self.exercises: Counter = Counter()
        self.tabs: Counter = Counter()
        self.layers: Counter = Counter()
        self.prompt_chars: Counter = Counter()
        self.prompts: deque = deque(maxlen=MAX_PROMPTS)
        self.started = time.time()

    def exercise(self, index: int) -> None:
        """Exercise `index` (0-based) was opened."""
        with self._lock:
            self.exercises[index] += 1

    def record(self, kind: str, req) -> None:
        """The service's observer: one request of `kind` ("lens", "compare", ...) was asked for, and counted."""
        tab = tab_of(kind, req)
        prompts = list(getattr(req, "prompts", None) or [getattr(req, "prompt", None)])
        if kind == "chat":
            prompts = [m["content"] for m in req.messages if m.get("role") == "user"][-1:]
        prompts = [p for p in prompts if isinstance(p, str)]
        layers = self._layers(kind, req)
        with self._lock:
            self.tabs[tab] += 1
            self.layers.update(layers)
            self.prompt_chars.update(length_bucket(len(p)) for p in prompts)
            if self.record_prompts:
                self.prompts.extend({"tab": tab, "prompt": p, "at": round(time.time())} for p in prompts)

    def _layers(self, kind: str, req) -> list[int]:
        try:
            if kind == "chat":
                return [] if req.layer is None else [req.layer % self.n_layers]
            return Selection(req.layers).resolve(self.n_layers)
        except (RequestError, AttributeError, TypeError):
            return []

    def summary(self) -> dict:
        """The counts (what /health shows)."""
        with self._lock:
            return {"exercises": {f"{i + 1}. {t}": self.exercises[i] for i, t in enumerate(self.exercise_titles)},
                    "tabs": dict(self.tabs), "layers": {str(k): v for k, v in sorted(self.layers.items())},
                    "prompt_chars": {b: self.prompt_chars[b] for b in _buckets() if self.prompt_chars[b]}}

    def to_json(self) -> dict:
        """Everything kept, for the host: the counts, and the prompts only when the file asked for them."""
        out = {"since": round(self.started), "record_prompts": self.record_prompts, **self.summary()}
        if self.record_prompts:
            with self._lock:
                out["prompts"] = list(self.prompts)
        return out


def _buckets() -> list[str]:
    return [length_bucket(n) for n in (0, *LENGTH_BUCKETS)]

"""Who a request is for, as a value: whose turn it takes at the engine, who pays for its work, whether a workshop
counts it, whether its results are kept for good.

An `Ask` travels with the request: the service's entries take one (`LensService.lens(req, ask=...)`) and hand it
down, so each reader finds it in its arguments: the engine's fair turns (`Engine.lens(..., client=ask.client)`),
the work budget (`LensService.admitted(work, ask)`: `ask.paying`), the result cache (`cached(..., pin=ask.pin)`) and a
workshop's counts (`ask.counted`). What is paid comes back as a value, a `Receipt` that gives back what did not
run: `paying` gives it all back when the engine refuses the work (`UNSERVED`) and keeps only what a stream made
when its reader leaves. `HOST` is the app's own ask (the command line, the tests): nobody's turn or
budget, counted, kept as any result is.

One ambient value remains, `asking`/`asked`, for the one hop the ask does not make as an argument: from the guard
(ui/guard.py, which knows the visitor from the `gr.Request` Gradio hands a handler) to the service. Between them
lies every tab's handler (`(view, service, guard, values, request)`, some two dozen, wired by name in `tabs.on`),
which Gradio calls with the page's values, each step of a streamed one on whichever worker thread is free (so the
guard names the ask again for each step); the front page and a link's first events call the same handlers, and
their wishes (pinned, not counted) go through them too. The guard, the front page and a link's first events name
it there (`asking(...)`); a service entry given no ask reads it once (`asked()`) and passes it on as a value from
then on. A caller that holds the ask hands it over instead (ui/prefetch.py); handing it through each tab handler
is what would retire this last ambient value.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator

from ..engine.run.errors import EngineBusy, EngineDown, EngineRestarted

# The engine's refusals: work it never ran (busy, over the asker's share, down), or ran for nothing and asks to be
# run again (restarted under it). Whoever paid for it is given it back whole.
UNSERVED = (EngineBusy, EngineDown, EngineRestarted)


class Receipt:
    """What one piece of work was paid (`units`), and how much of it is still `held`: `keep(n)` gives back all
    but `n` of what is held (to the accounts it came from: the payer's `give_back`), never more than once."""

    def __init__(self, units: int = 0, give_back: Callable[[float], None] | None = None):
        self.units, self.held, self._give_back = units, units, give_back
        self._lock = threading.Lock()

    def keep(self, units: float) -> None:
        with self._lock:
            back, self.held = self.held - max(0, units), min(self.held, max(0, units))
        if back > 0 and self._give_back is not None:
            self._give_back(back)

    def refund(self) -> None:
        """Nothing of it ran: all of it given back."""
        self.keep(0)


@dataclass(frozen=True)
class Ask:
    """Who asks and what they wish.

    client: whose turn at the engine (engine/run/turns.py); None: the host's, which no per-client bound limits.
    payer: takes each piece of engine work (cost.py's units) as it starts, or refuses it (limits.RateLimited), and
        returns how to give some of it back (`give_back(units)`; None: nothing to give back); None: nobody pays
        (the app's own work).
    counted: a workshop's counts hear of it (usage.py); the front page's examples and a link's second look are not.
    pin: its results are kept for good, outside the result cache's bounds (cache.py): the front page's examples.
    """

    client: str | None = None
    payer: Callable[[int], Callable[[float], None] | None] | None = field(default=None, compare=False)
    counted: bool = True
    pin: bool = False

    def pay(self, units: int) -> Receipt:
        """Work of `units` starts now: whoever pays takes it, or refuses it (RateLimited); its receipt."""
        if self.payer is None or units <= 0:
            return Receipt()
        give_back = self.payer(units)
        return Receipt(units, give_back if callable(give_back) else None)

    @contextlib.contextmanager
    def paying(self, units: int, made: Callable[[], int] | None = None) -> Iterator[Receipt]:
        """Work of `units` runs within this block, paid as it starts (`pay`), and the payer pays for what ran: the
        engine refusing it (UNSERVED) gives it all back; with `made` (what ran so far, in units: a generation's
        steps), the block ended, or closed early (a stream whose reader left: GeneratorExit), keeps only that.
        Any other failure keeps it all (the work ran, or was the request's own)."""
        receipt = self.pay(units)
        try:
            yield receipt
        except UNSERVED:
            receipt.refund()
            raise
        except GeneratorExit:
            if made is not None:
                receipt.keep(made())
            raise
        if made is not None:
            receipt.keep(made())


HOST = Ask()

# Why ambient: Gradio calls the page's handlers, not we (see the module's docstring); nothing below the service's
# entries reads it.
_ASKED: contextvars.ContextVar[Ask] = contextvars.ContextVar("asked", default=HOST)


@contextlib.contextmanager
def asking(**changes) -> Iterator[Ask]:
    """Within this block (this thread), the ask a service entry given none reads is the current one with `changes`
    (`client`, `payer`, `counted`, `pin`)."""
    ask = replace(_ASKED.get(), **changes)
    token = _ASKED.set(ask)
    try:
        yield ask
    finally:
        _ASKED.reset(token)


def asked(ask: Ask | None = None) -> Ask:
    """`ask`, or when None the one a handler was called with (`asking`): what a service entry hands down."""
    return _ASKED.get() if ask is None else ask

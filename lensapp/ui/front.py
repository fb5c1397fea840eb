"""The front page: every tab opens on a drawn example, computed once and kept.

A visitor without a link used to meet an empty chart, an empty table and a button. Now the page's
load event draws every tab's default view (the logit lens of "The capital of France is" first, then
the Jacobian lens, a generation, a comparison and an intervention). `FrontPage.warm` computes those
once, as soon as the engine serves, asked to be pinned in the result cache and not counted (`asks.asking`): they
are never evicted, so a crowd of first visitors costs the engine nothing (only the charts are drawn per visit).
"""

from __future__ import annotations

import logging
import threading

from ..service.asks import asking
from .permalinks import View
from .tabs import TabParts

log = logging.getLogger(__name__)

FRONT = "*"          # the page-load `pending` value that runs every tab's default view (a link names one tab)


def default_values(p: TabParts) -> dict:
    """The readout's input values as the page first shows them, by name: the tab's default view, and what else
    it reads (the link's note) as the page starts it."""
    return {**p.view.values_of(View(tab=p.name)), **{name: c.value for name, c in p.reads.items()}}


class FrontPage:
    def __init__(self, service, parts: list[TabParts]):
        self.service = service
        self.parts = [p for p in parts if p.run is not None]
        self.warmed = threading.Event()

    def warm_in_background(self) -> threading.Thread:
        thread = threading.Thread(target=self.warm, name="lens-front-page", daemon=True)
        thread.start()
        return thread

    def warm(self) -> None:
        """Compute and pin every tab's default view once the engine serves. Twice over: a visitor who came
        first computed some of them unpinned, and the second pass pins what it reads (no engine time)."""
        try:
            self.service.wait_ready()
        except Exception as e:  # noqa: BLE001 - a model that is down is the status line's to explain
            log.warning("front page not precomputed: %s", e)
            return
        with asking(pin=True, counted=False):          # the tabs' handlers carry no ask: service/asks.py
            for _ in range(2):
                for p in self.parts:
                    try:
                        p.run(default_values(p))
                    except Exception as e:  # noqa: BLE001 - that tab's visitors will see the same error
                        log.warning("front page: the %s tab's example failed: %s", p.name, e)
        log.info("front page ready: %s", ", ".join(p.name for p in self.parts))
        self.warmed.set()

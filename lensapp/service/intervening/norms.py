"""Each layer's typical residual norm: the unit of a steering strength, measured once on a reference paragraph.

A steering vector is alpha times its layer's typical norm long (`interventions.scaled`), so an alpha means
the same push at every layer although the stream's norm grows with depth. The typical norm is the median
over positions of ||h|| (the first position, an attention sink, left out: `interventions.typical_norm`),
on REFERENCE_TEXT, read by the engine once per model and kept. A mean ablation with no reference text of
its own takes its means over the same paragraph.
"""

from __future__ import annotations

import dataclasses
import threading

from ...lens_kinds import LOGIT
from .. import planning

# A paragraph of plain English: each layer's typical residual norm (the unit of alpha) is measured on it.
REFERENCE_TEXT = ("The old harbour town wakes early. Fishing boats come back before the sun is high, and the "
                  "market fills with people buying bread, fruit and the morning's catch. Children walk to "
                  "school along the river, and the church bell rings the hour.")


class TypicalNorms:
    """One model's typical residual norms, by layer: measured on first use, then kept."""

    def __init__(self):
        self._norms: dict[tuple[int, ...], list[float]] = {}
        self._lock = threading.Lock()

    def get(self, engine, reference_ids: list[int], n_layers: int, client: str | None = None) -> list[float]:
        """[n_layers] floats: each layer's median ||h|| over the reference's positions (one engine readout, once per
        reading of the reference: with BOS first or not, as every prompt is read: prompts.py), in `client`'s turn
        (the first to need them)."""
        key = tuple(reference_ids)
        with self._lock:
            if key not in self._norms:
                spec = planning.lens_spec(reference_ids, list(range(n_layers)), 1, (LOGIT.name,), n_layers, [])
                (out,) = engine.lens([dataclasses.replace(spec, norms=True)], client=client)
                self._norms[key] = [float(x) for x in out.norms]
            return self._norms[key]

"""Results as JSON text: what `--json` prints and the JSON download serves, each result's numbers rounded as every
result's `to_json` rounds them (a result writes its own CSV: `to_csv`)."""

from __future__ import annotations

import json

import numpy as np


def round_floats(a: np.ndarray, digits: int = 5) -> list:
    """Nested lists of floats with `digits` significant digits (tiny probabilities stay visible)."""
    a = np.asarray(a, dtype=np.float64)
    if a.ndim == 0:
        return float(f"{a:.{digits}g}")
    # One pass over a flat Python list (np.vectorize costs ~0.3 ms a call even on 150 values, and a
    # generation converts three arrays per step), then the nesting back through an object array.
    flat = [float(f"{x:.{digits}g}") for x in a.ravel().tolist()]
    return np.array(flat, dtype=object).reshape(a.shape).tolist()


def dumps(obj) -> str:
    """JSON text of a result (or list of results), UTF-8 kept readable."""
    if isinstance(obj, list):
        return json.dumps([o.to_json() for o in obj], ensure_ascii=False)
    return json.dumps(obj.to_json(), ensure_ascii=False)

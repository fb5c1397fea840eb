"""The lenses the app reads, each declared once: its name, what it reads through, how it is shown.

A `Lens` is a value, as tuned-lens's lens classes are: every caller asks it (the layers it may read, whether it
reads through the loaded Jacobian stack, its title), never compares its name. A name is parsed into one at the
edge (a request's `lens` field: `service/fields.py`, whose choices and help are made from `LENSES`) and looked
up with `lens()` after that. `readings()` are what a request's `lens` field may name: each lens alone, and
"both" (the logit and the Jacobian lens side by side, the Jacobian tab's reading).

A new lens is one `declare(Lens(...))`, here or in a module imported before `service/fields.py` (the request
fields, the command line, the API and the tabs are made from `LENSES` as they are imported); its readout is
`transform` (h [L, P, d_model] -> the same shape, before the final norm), run in the engine's trace, so a
declaration made outside this module reaches a backend in the same process only (not vLLM's workers).

Pure: this module imports nothing at import (charts, which never import torch, read titles from it); a transform
may import `lenses.py`'s math inside itself, when it runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

BOTH = "both"       # the Jacobian tab's reading: the Jacobian and the logit lens, side by side


@dataclass(frozen=True)
class Lens:
    """One lens.

    reads_jlens: it reads through the loaded Jacobian stack (J_l per layer): only at the layers the stack has,
      only when one is loaded, and every prompt with BOS first when the stack was fitted so (prompts.py).
    transform: h [L, P, d_model] -> [L, P, d_model] before the lens's transport and the final norm (None: as is).
    title: in charts, tables and summaries ("logit lens"); label: a short name in a sentence ("J-lens").
    script: its transport in "Show the code"'s script, `lambda layer, h: ...` (J: the lens file's {layer: J}; "":
      it has none, and a script of it is refused).
    """

    name: str
    title: str
    label: str
    reads_jlens: bool = False
    transform: Callable | None = None
    script: str = ""

    def layers(self, n_layers: int, jlens_layers: list[int]) -> list[int]:
        """The layers this lens can read on a model of n_layers (jlens_layers: the loaded stack's; [] for none)."""
        return list(jlens_layers) if self.reads_jlens else list(range(n_layers))

    def available(self, jlens_loaded: bool) -> bool:
        """Whether this app can read it (one that reads through J only with a Jacobian lens loaded)."""
        return jlens_loaded or not self.reads_jlens


LENSES: dict[str, Lens] = {}


def declare(new: Lens) -> Lens:
    """Add a lens (its name new, and not "both")."""
    if new.name in LENSES or new.name == BOTH:
        raise ValueError(f"a lens named {new.name!r} is already declared")
    LENSES[new.name] = new
    return new


LOGIT = declare(Lens("logit", "logit lens", "logit lens", script="lambda layer, h: h"))
JACOBIAN = declare(Lens("jacobian", "Jacobian lens", "J-lens", reads_jlens=True,
                        script="lambda layer, h: h @ J[layer].to(h.dtype).T if layer in J else h"))


def lens(name: str) -> Lens:
    """The lens of that name (a name a parser let through; KeyError otherwise)."""
    return LENSES[name]


def readings() -> dict[str, tuple[str, ...]]:
    """What a request's `lens` may name -> the lenses it reads: each lens alone, then both."""
    return {**{name: (name,) for name in LENSES}, BOTH: (LOGIT.name, JACOBIAN.name)}


def reads_jlens(names) -> bool:
    """Whether any of these lenses (names) reads through the Jacobian stack."""
    return any(LENSES[name].reads_jlens for name in names)


def read_by(reading: str) -> tuple[str, ...]:
    """The lenses a request's `lens` value reads."""
    return readings()[reading]


def titles() -> dict[str, str]:
    return {name: lens.title for name, lens in LENSES.items()}


def shown(reading: str) -> tuple[str, ...]:
    """The lenses a readout of `reading` draws, in their order: those that read through J first (both: side by
    side, the Jacobian lens first)."""
    return tuple(sorted(read_by(reading), key=lambda name: not LENSES[name].reads_jlens))

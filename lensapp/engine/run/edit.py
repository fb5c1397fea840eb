"""One change to the residual stream, as a request carries it into its own trace: checked when made, and
against the model and the prompt before any trace runs.

The service builds the vector (a direction, a source's kept rows); the math of each kind is
`lensapp.interventions`'s, and the trace bodies make it (`trace.py`). This knows no text, no words and no
direction math: a layer, a kind, a tensor and the positions it changes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...interventions import KINDS


@dataclass(frozen=True, eq=False)
class Edit:
    """One change to the residual stream leaving block `layer`, made inside the request's own trace
    (the math: `lensapp.interventions`). The service builds the vector; the engine does no direction math.

    kind: "add" (s += vector), "project_out" (s -= (s.u) u), "set_component" (s += (value - s.u) u),
      "replace" (s[positions] = vector's rows), with u = vector / ||vector|| (a zero vector edits nothing).
    vector: float32 CPU [d_model]; for "replace" [n_positions, d_model], row i for positions[i] (for
      every prompt position, in order, when positions is None).
    positions: the prompt positions edited; None: all of them.
    generated: also edit every generated token of a generation (and the target tokens a continuation
      appends to the prompt); only with positions None, and not for "replace".
    Edits compare by identity (they hold a tensor).
    """

    layer: int
    kind: str
    vector: torch.Tensor
    positions: tuple[int, ...] | None = None
    value: float = 0.0
    generated: bool = False

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"edit kind {self.kind!r} is not one of {KINDS}")
        if not isinstance(self.vector, torch.Tensor):
            raise ValueError(f"an edit's vector must be a tensor, got {type(self.vector).__name__}")
        want = 2 if self.kind == "replace" else 1
        if self.vector.ndim != want:
            raise ValueError(f"a {self.kind} edit's vector must be {want}-D, got {tuple(self.vector.shape)}")
        if self.positions is not None:
            if not self.positions or len(set(self.positions)) != len(self.positions):
                raise ValueError(f"edit positions must be distinct and not empty, got {self.positions}")
            if self.kind == "replace" and self.vector.shape[0] != len(self.positions):
                raise ValueError(f"replace: {self.vector.shape[0]} rows for {len(self.positions)} positions")
        if self.generated and (self.positions is not None or self.kind == "replace"):
            raise ValueError("a generated-token edit applies at every position: positions None, and not replace")

    @property
    def changes_nothing(self) -> bool:
        """A zero vector added, projected out or set along (a sweep's alpha 0): the stream stays exactly as it was.
        ("replace" writes its rows, zeros or not.)"""
        return self.kind != "replace" and not bool(self.vector.any())

    def check(self, n_layers: int, d_model: int, prompt_len: int) -> None:
        """ValueError when the edit does not fit the model or the prompt."""
        if not 0 <= self.layer < n_layers:
            raise ValueError(f"edit layer {self.layer} is outside 0..{n_layers - 1}")
        if self.vector.shape[-1] != d_model:
            raise ValueError(f"edit vector {tuple(self.vector.shape)} does not fit d_model {d_model}")
        if self.positions is not None and not all(0 <= p < prompt_len for p in self.positions):
            raise ValueError(f"edit positions {self.positions} are outside the prompt's 0..{prompt_len - 1}")
        if self.kind == "replace" and self.positions is None and self.vector.shape[0] != prompt_len:
            raise ValueError(f"replace: {self.vector.shape[0]} rows for a prompt of {prompt_len} positions")

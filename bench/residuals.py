"""What the benches read inside a trace: the residual stream after each listed block, unedited."""

from __future__ import annotations

import torch

from lensapp.engine.run.families import Layout, find, residual


def read_residuals(model, layout: Layout, layers, d_model: int) -> torch.Tensor:
    """[len(layers), P, d_model]: the residual stream after each listed block, unedited (the benches' read)."""
    blocks = find(model, layout.blocks)
    return torch.stack([residual(blocks[layer].output, layout).reshape(-1, d_model) for layer in layers])

"""One matrix multiply for several projections of the same input: a flat layer's query, key
and value projections fused, their outputs side by side."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


def fused_projection(parts: Sequence[nn.Linear]) -> nn.Linear:
    """A linear layer computing `parts` (same input width) at once: their weights stacked,
    their biases too where they have them, on their device and in their dtype."""
    weight = parts[0].weight
    biased = parts[0].bias is not None
    fused = nn.Linear(
        parts[0].in_features,
        sum(p.out_features for p in parts),
        bias=biased,
        device=weight.device,
        dtype=weight.dtype,
    )
    with torch.no_grad():
        fused.weight.copy_(torch.cat([p.weight for p in parts]))
        if biased:
            fused.bias.copy_(torch.cat([p.bias for p in parts]))
    return fused

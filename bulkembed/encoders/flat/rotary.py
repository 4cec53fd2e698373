"""Rotary positions of a flat batch, for the families that turn queries and keys by them
(ModernBERT, the decoders): each token's angles at its place in its own document, from the
model's own rotary module, and the turn itself as transformers makes it."""

from __future__ import annotations

from typing import Any

import torch

from bulkembed.encoders.varlen import Sequences

# Rotary cosines and sines, each [tokens, 1, head size].
Rotary = tuple[torch.Tensor, torch.Tensor]


def rotary_angles(module: Any, hidden: torch.Tensor, sequences: Sequences, *kind: str) -> Rotary:
    """The cosines and sines of every token of `hidden` by the model's rotary `module`
    (given position ids as [1, tokens], so that a scaling fixed at loading is the model's
    own; `kind`: the layer type, for a module with angles per type), at the token's place
    in its document."""
    cos, sin = module(hidden, sequences.positions().unsqueeze(0), *kind)
    return cos[0].unsqueeze(1), sin[0].unsqueeze(1)


def rotate(states: torch.Tensor, rotary: Rotary, in_float32: bool = False) -> torch.Tensor:
    """Queries or keys [tokens, heads, head size] turned by their tokens' rotary angles (the
    two halves of each head as the two coordinates); `in_float32` computes the turn in
    float32 and casts it back, as ModernBERT does."""
    cos, sin = rotary
    wide = states.float() if in_float32 else states
    first, second = wide.chunk(2, dim=-1)
    turned = wide * cos + torch.cat((-second, first), dim=-1) * sin
    return turned.to(states.dtype)

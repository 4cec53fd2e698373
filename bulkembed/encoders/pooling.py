"""Pooling of token vectors into one vector per sequence. Pure: inputs are never modified,
and sums are taken in float32 whatever the model's dtype."""

from __future__ import annotations

import torch

from bulkembed.config import Pooling


def cls_pool(hidden: torch.Tensor) -> torch.Tensor:
    """The first token's vector (sequences padded on the right)."""
    return hidden[:, 0].float()


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean of the vectors of real tokens; the divisor is clamped so empty rows give zeros."""
    mask = attention_mask.unsqueeze(-1).to(torch.float32)
    summed = (hidden.float() * mask).sum(dim=1)
    return summed / mask.sum(dim=1).clamp(min=1e-9)


def last_token_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The vector of each sequence's last real token (sequences padded on the right)."""
    last = attention_mask.sum(dim=1).clamp(min=1) - 1
    rows = torch.arange(hidden.shape[0], device=hidden.device)
    return hidden[rows, last].float()


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, mode: Pooling) -> torch.Tensor:
    """One float32 vector per sequence, by `mode`."""
    if mode is Pooling.CLS:
        return cls_pool(hidden)
    if mode is Pooling.MEAN:
        return mean_pool(hidden, attention_mask)
    return last_token_pool(hidden, attention_mask)

"""Pooling of token vectors into one vector per document, over the real tokens of a batch
laid end to end ([tokens, hidden], `Sequences` saying where each document is). Pure: inputs
are never modified, and sums are taken in float32 whatever the model's dtype. A document of
no tokens pools to zeros."""

from __future__ import annotations

import torch

from bulkembed.config import Pooling
from bulkembed.encoders.varlen import Sequences


def _rows(tokens: torch.Tensor, index: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """The token vectors at `index` (one per document) in float32; zeros for empty ones."""
    empty = cu_seqlens[1:] == cu_seqlens[:-1]
    if not len(tokens):
        return torch.zeros(len(empty), tokens.shape[-1], device=tokens.device)
    rows = tokens.index_select(0, index.long().clamp(0, len(tokens) - 1)).float()
    return torch.where(empty.unsqueeze(-1), 0.0, rows)


def cls_pool(tokens: torch.Tensor, sequences: Sequences) -> torch.Tensor:
    """Each document's first token vector."""
    cu = sequences.cu_seqlens
    return _rows(tokens, cu[:-1], cu)


def last_token_pool(tokens: torch.Tensor, sequences: Sequences) -> torch.Tensor:
    """Each document's last token vector."""
    cu = sequences.cu_seqlens
    return _rows(tokens, cu[1:] - 1, cu)


def mean_pool(tokens: torch.Tensor, sequences: Sequences) -> torch.Tensor:
    """The mean of each document's token vectors; the divisor is clamped so that an empty
    document gives zeros. Each document's sum is one segment's reduction, in token order
    (no atomic adds: the same vector on every run, on a GPU too)."""
    cu = sequences.cu_seqlens.long()
    summed = torch.segment_reduce(tokens.float(), "sum", offsets=cu, axis=0, unsafe=True)
    counts = (cu[1:] - cu[:-1]).unsqueeze(-1).to(torch.float32)
    return summed / counts.clamp(min=1.0)


def pool(tokens: torch.Tensor, sequences: Sequences, mode: Pooling) -> torch.Tensor:
    """One float32 vector per document, by `mode`."""
    if mode is Pooling.CLS:
        return cls_pool(tokens, sequences)
    if mode is Pooling.MEAN:
        return mean_pool(tokens, sequences)
    return last_token_pool(tokens, sequences)

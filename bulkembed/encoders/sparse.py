"""Sparse vectors from token weights. Pure functions of tensors already on the host."""

from __future__ import annotations

import numpy as np
import torch

from bulkembed.contracts import SparseVector


def max_weight_per_token(
    weights: np.ndarray, token_ids: np.ndarray, excluded: np.ndarray, top_k: int | None = None
) -> SparseVector:
    """One document's lexical weights: for each vocabulary id among `token_ids` (real
    tokens only), the largest of its weights; ids in `excluded` and weights <= 0 dropped;
    only the `top_k` largest kept if given.

    >>> max_weight_per_token(np.array([0.5, 0.2, 0.9, 0.0]), np.array([7, 3, 7, 4]), np.array([]))
    SparseVector(indices=array([3, 7], dtype=int32), values=array([0.2, 0.9], dtype=float32))
    """
    keep = (weights > 0) & ~np.isin(token_ids, excluded)
    ids, kept = token_ids[keep], weights[keep]
    if len(ids) == 0:
        return SparseVector(np.empty(0, np.int32), np.empty(0, np.float32))
    order = np.argsort(ids, kind="stable")
    ids, kept = ids[order], kept[order]
    unique, starts = np.unique(ids, return_index=True)
    values = np.maximum.reduceat(kept, starts).astype(np.float32)
    if top_k is not None and len(unique) > top_k:
        best = np.sort(np.argsort(-values, kind="stable")[:top_k])
        unique, values = unique[best], values[best]
    return SparseVector(unique.astype(np.int32), values)


def splade_pool(logits: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """`max` over the sequence of `log(1 + relu(logits))`, padding masked out: [batch, vocab].

    Works in place on float32 logits (a copy only if they are in another dtype), so the
    slice's logits are the largest tensor alive."""
    activated = logits.float()
    activated.relu_().log1p_()
    activated.masked_fill_(attention_mask.unsqueeze(-1) == 0, 0.0)
    return activated.amax(dim=1)


def nonzero_rows(matrix: torch.Tensor, top_k: int | None = None) -> list[SparseVector]:
    """Each row's non-zero entries, ascending by index; only the `top_k` largest if given."""
    rows = []
    for row in matrix.cpu():
        indices = torch.nonzero(row > 0).squeeze(-1)
        values = row[indices]
        if top_k is not None and len(indices) > top_k:
            best = torch.topk(values, top_k).indices.sort().values
            indices, values = indices[best], values[best]
        rows.append(SparseVector(indices.numpy().astype(np.int32), values.numpy()))
    return rows

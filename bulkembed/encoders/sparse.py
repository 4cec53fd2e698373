"""Sparse vectors from token weights, on the device, in shapes fixed by the batch: the
host gets each document's entries as the weights > 0 of a [documents, K] matrix, in
ascending id order (see `DeviceOutputs`), with no per-document loop on either side."""

from __future__ import annotations

import torch

# An id no vocabulary reaches: marks positions that hold no entry, and sorts last.
_NO_ID = torch.iinfo(torch.int64).max


def keep_top_k(weights: torch.Tensor, top_k: int | None) -> torch.Tensor:
    """`weights` [documents, K] with all but each row's `top_k` largest set to 0; of equal
    weights the first (lowest id) is kept.

    >>> keep_top_k(torch.tensor([[0.5, 0.9, 0.5, 0.1]]), 2).tolist()
    [[0.5, 0.8999999761581421, 0.0, 0.0]]
    """
    if top_k is None or weights.shape[1] <= top_k:
        return weights
    best = torch.sort(-weights, dim=1, stable=True).indices[:, :top_k]
    chosen = torch.zeros_like(weights, dtype=torch.bool).scatter_(1, best, True)
    return torch.where(chosen, weights, 0.0)


def max_weight_per_id(
    weights: torch.Tensor, token_ids: torch.Tensor, keep: torch.Tensor, top_k: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lexical weights of each document: for each vocabulary id among its tokens where
    `keep` [documents, L] is true, the largest of its weights [documents, L]; weights <= 0
    dropped; only the `top_k` largest kept if given. Returns (ids, weights), both
    [documents, L]: a document's entries are where the weight is > 0, by ascending id.

    >>> ids, weights = max_weight_per_id(
    ...     torch.tensor([[0.5, 0.2, 0.9, 0.0, 0.3]]),
    ...     torch.tensor([[7, 3, 7, 4, 2]]),
    ...     torch.tensor([[True, True, True, True, False]]),
    ... )
    >>> [(int(i), round(float(w), 2)) for i, w in zip(ids[0], weights[0]) if w > 0]
    [(3, 0.2), (7, 0.9)]
    """
    weights = weights.float()
    present = keep & (weights > 0)
    ids = torch.where(present, token_ids.long(), _NO_ID)
    ids, order = torch.sort(ids, dim=1, stable=True)
    weights = torch.where(present, weights, 0.0).gather(1, order)
    # Runs of one id: the position of each token's run, and the run's largest weight.
    starts = torch.ones_like(ids, dtype=torch.bool)
    starts[:, 1:] = ids[:, 1:] != ids[:, :-1]
    run = starts.cumsum(dim=1) - 1
    best = torch.zeros_like(weights).scatter_reduce_(1, run, weights, "amax")
    run_ids = torch.full_like(ids, _NO_ID).scatter_(1, run, ids)
    best = torch.where(run_ids != _NO_ID, best, 0.0)
    return run_ids, keep_top_k(best, top_k)


def splade_pool(logits: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """`max` over the sequence of `log(1 + relu(logits))`, padding masked out: [batch, vocab].

    Works in place on float32 logits (a copy only if they are in another dtype), so the
    slice's logits are the largest tensor alive."""
    activated = logits.float()
    activated.relu_().log1p_()
    activated.masked_fill_(attention_mask.unsqueeze(-1) == 0, 0.0)
    return activated.amax(dim=1)

"""Sparse vectors from token weights, on the device, in shapes fixed by the batch: the
host gets each document's entries as the weights > 0 of a [documents, vocabulary] matrix
(SPLADE) or of a list of (document, id, weight) entries (BGE-M3), in ascending id order (see
`DeviceOutputs`), with no per-document loop on either side."""

from __future__ import annotations

import torch

# An id no vocabulary reaches: marks positions that hold no entry, and sorts last.
_NO_ID = torch.iinfo(torch.int64).max
# Keys of (document, id) pairs are document × _ID_SPAN + id: vocabulary ids are int32.
_ID_SPAN = 1 << 32


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
    weights: torch.Tensor,
    token_ids: torch.Tensor,
    documents: torch.Tensor,
    keep: torch.Tensor,
    top_k: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Lexical weights of each document, from the tokens of a batch laid end to end (all
    [tokens]: a weight, a vocabulary id and a document each): for each id among a
    document's tokens where `keep` is true, the largest of its weights; weights <= 0
    dropped; only each document's `top_k` largest kept if given.

    Returns (documents, ids, weights), each [tokens]: the entries are where the weight is
    > 0, ordered by document, then by ascending id.

    >>> documents, ids, weights = max_weight_per_id(
    ...     torch.tensor([0.5, 0.2, 0.9, 0.0, 0.3, 0.4]),
    ...     torch.tensor([7, 3, 7, 4, 2, 5]),
    ...     torch.tensor([0, 0, 0, 0, 0, 1]),
    ...     torch.tensor([True, True, True, True, False, True]),
    ... )
    >>> [(int(d), int(i), round(float(w), 2)) for d, i, w in zip(documents, ids, weights) if w > 0]
    [(0, 3, 0.2), (0, 7, 0.9), (1, 5, 0.4)]
    """
    weights = weights.float()
    present = keep & (weights > 0)
    keys = torch.where(present, documents.long() * _ID_SPAN + token_ids.long(), _NO_ID)
    keys, order = torch.sort(keys, stable=True)
    weights = torch.where(present, weights, 0.0)[order]
    # Runs of one (document, id): the position of each token's run, and its largest weight.
    starts = torch.ones_like(keys, dtype=torch.bool)
    starts[1:] = keys[1:] != keys[:-1]
    run = starts.cumsum(0) - 1
    best = torch.zeros_like(weights).scatter_reduce_(0, run, weights, "amax")
    run_keys = torch.full_like(keys, _NO_ID).scatter_(0, run, keys)
    found = run_keys != _NO_ID
    best = torch.where(found, best, 0.0)
    run_documents = torch.where(found, run_keys // _ID_SPAN, 0)
    if top_k is not None:
        best = _top_k_per_document(best, run_documents, top_k)
    return run_documents, run_keys % _ID_SPAN, best


def _top_k_per_document(weights: torch.Tensor, documents: torch.Tensor, top_k: int) -> torch.Tensor:
    """`weights` with all but each document's `top_k` largest set to 0; of equal weights
    the first is kept (entries come by ascending id, so the lowest id)."""
    by_weight = torch.sort(-weights, stable=True).indices
    order = by_weight[torch.sort(documents[by_weight], stable=True).indices]
    grouped = documents[order]
    positions = torch.arange(len(order), device=weights.device)
    first = torch.ones_like(grouped, dtype=torch.bool)
    first[1:] = grouped[1:] != grouped[:-1]
    group_start = torch.where(first, positions, 0).cummax(0).values
    chosen = torch.zeros_like(weights, dtype=torch.bool)
    chosen[order] = positions - group_start < top_k
    return torch.where(chosen, weights, 0.0)


def splade_pool(logits: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """`max` over the sequence of `log(1 + relu(logits))`, padding masked out: [batch, vocab].

    Works in place on float32 logits (a copy only if they are in another dtype), so the
    slice's logits are the largest tensor alive."""
    activated = logits.float()
    activated.relu_().log1p_()
    activated.masked_fill_(attention_mask.unsqueeze(-1) == 0, 0.0)
    return activated.amax(dim=1)

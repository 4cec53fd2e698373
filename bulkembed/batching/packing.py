"""Pack token-budget batches from a window of tokenized documents. Pure: no torch, no I/O.

A batch's cost is what the device computes for it: `longest × count` when every sequence is
padded to the longest, or the sum of lengths when sequences run unpadded (varlen). With the
default budget of 16384 tokens a padded batch holds 32 documents of 512 tokens, or 128 of 128,
or one document longer than the budget on its own.

Sorting a window by length first puts documents of similar length together, so little of a
padded batch is padding (real tokens over computed tokens is the padding efficiency).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from itertools import pairwise
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from bulkembed.models.model_spec import ModelSpec


class BudgetSource(str, Enum):
    """Where a token budget came from."""

    RECIPE = "recipe"  # the model's recipe, or the default
    GIVEN = "given"  # --max-batch-tokens N, the environment, `embed()`
    PROBED = "probed"  # the device's memory, measured at start


@dataclass(frozen=True, slots=True)
class BatchPolicy:
    """The token budget that batches are packed by, and where it came from. A device that
    probes its memory hands on a new policy (`probed`); none is changed in place."""

    tokens: int
    source: BudgetSource

    @classmethod
    def of(cls, spec: ModelSpec) -> BatchPolicy:
        """The budget a model's settings give, before any probe."""
        source = BudgetSource.GIVEN if spec.budget_given else BudgetSource.RECIPE
        return cls(spec.budget, source)

    def probed(self, tokens: int | None, lower_only: bool = True) -> BatchPolicy:
        """The policy after a probe found `tokens` (None: the probe does not bound batches,
        and this policy stays). Unless `lower_only` is false, never more than a budget
        probed before: batches packed by it must fit."""
        if tokens is None:
            return self
        if self.source is BudgetSource.PROBED and lower_only:
            tokens = min(tokens, self.tokens)
        return BatchPolicy(tokens, BudgetSource.PROBED)


@dataclass(frozen=True, slots=True)
class Batch:
    """Documents of a window (by position), longest first, and what they cost: padded to
    the longest, or (`unpadded`) their own tokens only."""

    indices: np.ndarray
    lengths: np.ndarray
    unpadded: bool = False

    @property
    def size(self) -> int:
        return len(self.indices)

    @property
    def tokens(self) -> int:
        """Real tokens in the batch."""
        return int(self.lengths.sum())

    @property
    def padded_tokens(self) -> int:
        """Tokens computed: every sequence padded to the longest, or the real tokens of an
        unpadded batch."""
        if self.unpadded:
            return self.tokens
        return int(self.lengths[0]) * self.size if self.size else 0

    def padded_lengths(self) -> np.ndarray:
        """The length each document was computed at: the longest, or its own (unpadded)."""
        if self.unpadded:
            return self.lengths.astype(np.int64)
        return np.full(self.size, self.lengths[0] if self.size else 0, np.int64)


def pack_batches(
    lengths: Sequence[int] | np.ndarray,
    max_batch_tokens: int,
    *,
    padded: bool = True,
    batch_overhead_tokens: int | None = None,
) -> list[Batch]:
    """Sort documents by length, longest first, and cut them into batches within the budget.

    Every document lands in exactly one batch. A batch never costs more than
    `max_batch_tokens`, except a single document longer than the budget, which goes alone.

    Padded batches are cut where they cost least in total: the tokens computed, padding
    included, plus `batch_overhead_tokens` per batch for the fixed cost of a forward pass
    (default: 1/64 of the budget). So 300 documents of 40 tokens and 300 of 5 become two
    batches, not one batch that is mostly padding. Unpadded batches (`padded=False`) cost
    their real tokens and are filled greedily.

    >>> [b.size for b in pack_batches([128] * 256 + [512] * 32, 16384)]
    [32, 128, 128]
    >>> [b.size for b in pack_batches([500] * 40 + [20] * 60, 16384, padded=False)]
    [32, 68]
    """
    if max_batch_tokens < 1:
        raise ValueError(f"max_batch_tokens must be positive, got {max_batch_tokens}")
    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.argsort(-lengths, kind="stable")
    sorted_lengths = lengths[order]
    if padded:
        overhead = (
            max_batch_tokens // 64 if batch_overhead_tokens is None else batch_overhead_tokens
        )
        ends = _cheapest_cuts(sorted_lengths, max_batch_tokens, overhead)
    else:
        ends = _greedy_cuts(sorted_lengths, max_batch_tokens)
    return [Batch(order[a:b], sorted_lengths[a:b], not padded) for a, b in pairwise([0, *ends])]


def _cheapest_cuts(sorted_lengths: np.ndarray, budget: int, overhead: int) -> list[int]:
    """Batch ends minimising padded tokens plus overhead per batch (lengths descending).

    cheapest[i] is the least cost of batching documents i.. onwards; a batch starting at i
    is padded to sorted_lengths[i], so it may take up to budget // sorted_lengths[i] documents.
    """
    n = len(sorted_lengths)
    cheapest = np.zeros(n + 1)
    end_of_batch = np.zeros(n, dtype=np.int64)
    for i in range(n - 1, -1, -1):
        longest = max(int(sorted_lengths[i]), 1)
        most = min(n - i, max(1, budget // longest))
        costs = longest * np.arange(1, most + 1) + overhead + cheapest[i + 1 : i + 1 + most]
        best = int(np.argmin(costs))
        cheapest[i] = costs[best]
        end_of_batch[i] = i + 1 + best
    ends = []
    position = 0
    while position < n:
        position = int(end_of_batch[position])
        ends.append(position)
    return ends


def _greedy_cuts(sorted_lengths: np.ndarray, budget: int) -> list[int]:
    """Batch ends filling each batch up to `budget` real tokens."""
    ends = []
    position = 0
    cumulative = np.cumsum(sorted_lengths)
    while position < len(sorted_lengths):
        already = cumulative[position - 1] if position else 0
        fits = int(np.searchsorted(cumulative, already + budget, side="right"))
        position = max(position + 1, fits)
        ends.append(position)
    return ends


def input_order(batches: Sequence[Batch]) -> np.ndarray:
    """Where each document of the window is in the batches' outputs laid end to end.

    `outputs[input_order(batches)]` puts per-batch outputs back in window order."""
    order = np.concatenate([b.indices for b in batches]) if batches else np.empty(0, np.int64)
    positions = np.empty(len(order), dtype=np.int64)
    positions[order] = np.arange(len(order))
    return positions

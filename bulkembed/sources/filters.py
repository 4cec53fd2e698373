"""Ids by hash: `id_hash`, and `SeenIds`, the set of ids a run has written, to drop
repeated ones."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable
from typing import Any

import numpy as np


def id_hash(doc_id: Any) -> int:
    """A 64-bit hash of an id (its decimal form for integers)."""
    return int.from_bytes(hashlib.blake2b(str(doc_id).encode(), digest_size=8).digest(), "little")


def id_hashes(ids: Iterable[Any]) -> np.ndarray:
    """`id_hash` of each id, as uint64."""
    return np.fromiter(map(id_hash, ids), dtype=np.uint64)


def sorted_contains(keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """For each of `values`, whether the sorted array `keys` holds it: a binary search
    each, where `np.isin` would sort both arrays again at every call.

    >>> sorted_contains(np.array([2, 5, 9]), np.array([5, 1, 9, 10])).tolist()
    [True, False, True, False]
    """
    if not len(keys):
        return np.zeros(len(values), dtype=bool)
    found = np.minimum(np.searchsorted(keys, values), len(keys) - 1)
    return keys[found] == values


# Ids hashed and added at once by `SeenIds.add_all`.
BULK = 1 << 16


class SeenIds:
    """A set of ids in 8 bytes each: 64-bit hashes, so 10 million ids take 80 MB.

    The hashes are held in sorted arrays, each at most half as long as the one before (two
    of one length are merged into one), so that adding n ids takes O(n log n) in all, and
    no Python object is made per id.

    Two different ids share a hash with a probability of about n² / 2⁶⁵ (3 in a million for
    10 million ids); the later one would then be reported as a duplicate, never dropped
    silently."""

    def __init__(self) -> None:
        self._levels: list[np.ndarray] = []

    def add(self, doc_id: Any) -> bool:
        """Record `doc_id`; False if it was already there."""
        return bool(self.add_hashes(np.array([id_hash(doc_id)], dtype=np.uint64))[0])

    def add_all(self, ids: Iterable[Any]) -> None:
        """Record every id of `ids` (an output's, read back), `BULK` at a time."""
        pending = iter(ids)
        while batch := list(itertools.islice(pending, BULK)):
            self.add_hashes(id_hashes(batch))

    def add_hashes(self, hashes: np.ndarray) -> np.ndarray:
        """Record the ids of 64-bit `hashes`, in order; for each, whether it is the first
        of its id (neither seen before nor earlier in `hashes`)."""
        unique, where = np.unique(hashes, return_index=True)
        fresh = np.ones(len(unique), dtype=bool)
        for level in self._levels:
            found = np.minimum(np.searchsorted(level, unique), len(level) - 1)
            fresh &= level[found] != unique
        first = np.zeros(len(hashes), dtype=bool)
        first[where[fresh]] = True
        new = unique[fresh]
        while self._levels and len(self._levels[-1]) <= len(new):
            # Two sorted runs of ids that no other holds: a stable sort merges them.
            new = np.sort(np.concatenate([self._levels.pop(), new]), kind="stable")
        if len(new):
            self._levels.append(new)
        return first

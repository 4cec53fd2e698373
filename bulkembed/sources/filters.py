"""`SeenIds`, the set of ids a run has written, to drop repeated ones, held as the ids'
keyed hashes (`id_keys`); and searches of sorted arrays."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa

from bulkembed.sources.id_keys import IdKey


def sorted_search(keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """`np.searchsorted(keys, values)`, searched in the order of the sorted values: a
    million searches in order take a fifth of the time of the same in random order, whose
    every step misses the cache (the sort included).

    >>> sorted_search(np.array([2, 5, 9]), np.array([9, 1, 5])).tolist()
    [2, 0, 1]
    """
    order = np.argsort(values)
    found = np.empty(len(values), dtype=np.intp)
    found[order] = np.searchsorted(keys, values[order])
    return found


class SeenIds:
    """A set of ids in 16 bytes each, their 128-bit hashes keyed by the run's `IdKey`: 10
    million ids take 160 MB.

    The hashes are held in levels, each two arrays (the hashes' first and second words)
    sorted by the first word and at most half as long as the level before (two of one
    length are merged into one), so that adding n ids takes O(n log n) in all and no Python
    object is made per id. An id is found by its first word and confirmed by its second:
    two ids whose first words are equal (by chance, odds about n² / 2⁶⁵) are both held."""

    def __init__(self, key: IdKey) -> None:
        self.key = key
        self._levels: list[tuple[np.ndarray, np.ndarray]] = []

    def add(self, doc_id: Any) -> bool:
        """Record `doc_id`; False if it was already there."""
        return bool(self.add_hashes(self.key.hash(doc_id)[None, :])[0])

    def add_all(self, ids: Iterable[pa.Array]) -> None:
        """Record every id of `ids` (arrays of an output's ids, read back)."""
        for array in ids:
            self.add_hashes(self.key.hashes(array))

    def contains(self, hashes: np.ndarray) -> np.ndarray:
        """For each id of `hashes` ([ids, 2], as `IdKey.hashes` gives them), whether it is
        held. The levels are searched in the order of the first words: a million searches
        in order take a fifth of the time of the same in random order."""
        order = np.argsort(hashes[:, 0])
        found = np.empty(len(hashes), dtype=bool)
        found[order] = self._holds_ordered(hashes[order])
        return found

    def _holds_ordered(self, hashes: np.ndarray) -> np.ndarray:
        """`contains` for `hashes` sorted by their first word."""
        found = np.zeros(len(hashes), dtype=bool)
        for first, second in self._levels:
            found |= _level_holds(first, second, hashes)
        return found

    def add_hashes(self, hashes: np.ndarray) -> np.ndarray:
        """Record the ids of `hashes` ([ids, 2]), in order; for each, whether it is the first
        of its id (neither seen before nor earlier in `hashes`)."""
        # Equal hashes side by side, each run's first the earliest (the sorts are stable):
        # sorted by the first word, and by the second too where first words tie (rare).
        order = np.argsort(hashes[:, 0], kind="stable")
        ordered = hashes[order]
        same = ordered[1:] == ordered[:-1]
        if (same[:, 0] & ~same[:, 1]).any():
            order = np.lexsort((hashes[:, 1], hashes[:, 0]))
            ordered = hashes[order]
            same = ordered[1:] == ordered[:-1]
        starts = np.ones(len(ordered), dtype=bool)
        starts[1:] = ~(same[:, 0] & same[:, 1])
        unique, where = ordered[starts], order[starts]
        fresh = ~self._holds_ordered(unique)
        first = np.zeros(len(hashes), dtype=bool)
        first[where[fresh]] = True
        new = (unique[fresh, 0].copy(), unique[fresh, 1].copy())
        while self._levels and len(self._levels[-1][0]) <= len(new[0]):
            # Two levels of ids that no other holds: sorted together by the first word.
            held = self._levels.pop()
            words = np.concatenate([held[0], new[0]]), np.concatenate([held[1], new[1]])
            merged = np.argsort(words[0], kind="stable")
            new = words[0][merged], words[1][merged]
        if len(new[0]):
            self._levels.append(new)
        return first


def _level_holds(first: np.ndarray, second: np.ndarray, hashes: np.ndarray) -> np.ndarray:
    """Which of `hashes` (sorted by their first word) one level (its words, sorted by
    `first`) holds: the entry found by the first word must have the same second word; where
    it does not, the entries after it of the same first word are looked at too (a chance tie
    of first words: rare)."""
    if not len(first):
        return np.zeros(len(hashes), dtype=bool)
    at = np.searchsorted(first, np.ascontiguousarray(hashes[:, 0]))
    clipped = np.minimum(at, len(first) - 1)
    tied = first[clipped] == hashes[:, 0]
    held = tied & (second[clipped] == hashes[:, 1])
    for index in np.flatnonzero(tied & ~held).tolist():
        entry, word, check = int(at[index]) + 1, hashes[index, 0], hashes[index, 1]
        while entry < len(first) and first[entry] == word:
            if second[entry] == check:
                held[index] = True
                break
            entry += 1
    return held

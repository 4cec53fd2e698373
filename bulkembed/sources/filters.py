"""Ids by hash: `id_hash`, and `SeenIds`, the set of ids a run has written, to drop
repeated ones."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# The 64-bit multipliers of the id hash (MurmurHash3's x64 constants).
_C1, _C2 = np.uint64(0x87C37B91114253D5), np.uint64(0x4CF5AD432745937F)
_F1, _F2 = np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53)
_TEXT_TYPES = (pa.string(), pa.large_string(), pa.binary(), pa.large_binary())


def id_hash(doc_id: Any) -> int:
    """A 64-bit hash of an id (its decimal form for integers): `id_hashes` of one."""
    return int(id_hashes(pa.array([str(doc_id)]))[0])


def id_hashes(ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A 64-bit hash of each id, as uint64: the id's UTF-8 bytes (integers in decimal, a
    missing id as `None`) mixed 8 bytes at a time, as MurmurHash3 mixes its blocks, with
    its length and MurmurHash3's finalizer. Computed on whole arrays: no Python object is
    made per id; a chunked array a chunk at a time."""
    if isinstance(ids, pa.ChunkedArray):
        hashed = [_hashes(chunk) for chunk in ids.chunks]
        return np.concatenate(hashed) if hashed else np.empty(0, np.uint64)
    return _hashes(ids)


def _hashes(ids: pa.Array) -> np.ndarray:
    """`id_hashes` of one array."""
    if ids.type not in _TEXT_TYPES:
        ids = pc.cast(ids, pa.string())
    if ids.null_count:
        ids = pc.fill_null(ids, "None")
    ids = pc.cast(ids, pa.large_binary())
    count = len(ids)
    buffers = ids.buffers()
    offsets = np.frombuffer(buffers[1], np.int64, count + 1, ids.offset * 8)
    data = np.frombuffer(buffers[2], np.uint8) if buffers[2] is not None else np.empty(0, np.uint8)
    # The bytes of these ids only (a slice's buffer is its parent's), then eight zero bytes:
    # the last block of the last id reads no further. Each position's next 8 bytes, as a
    # row of a strided view (no copy).
    data = np.concatenate([data[offsets[0] : offsets[-1]], np.zeros(8, np.uint8)])
    offsets = offsets - offsets[0]
    windows = np.lib.stride_tricks.as_strided(data, (len(data) - 7, 8), (1, 1), writeable=False)
    starts, lengths = offsets[:-1], np.diff(offsets)
    hashes = np.zeros(count, np.uint64)
    with np.errstate(over="ignore"):
        within = np.flatnonzero(lengths > 0)
        block = 0
        while len(within):
            at = starts[within] + block
            words = windows[at].view("<u8")[:, 0]
            left = lengths[within] - block
            short = left < 8
            masks = np.where(
                short,
                (np.uint64(1) << (8 * np.minimum(left, 7)).astype(np.uint64)) - 1,
                ~np.uint64(0),
            )
            words = words & masks
            words = _rotl(words * _C1, 31) * _C2
            hashes[within] = _rotl(hashes[within] ^ words, 27) * np.uint64(5) + np.uint64(
                0x52DCE729
            )
            within = within[~short & (left > 8)]
            block += 8
        hashes ^= lengths.astype(np.uint64)
        hashes ^= hashes >> np.uint64(33)
        hashes *= _F1
        hashes ^= hashes >> np.uint64(33)
        hashes *= _F2
        hashes ^= hashes >> np.uint64(33)
    return hashes


def _rotl(values: np.ndarray, bits: int) -> np.ndarray:
    return (values << np.uint64(bits)) | (values >> np.uint64(64 - bits))


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """The distinct values, sorted: a sort and a comparison of neighbours (`np.unique`
    takes a hash table for these, many times slower on a million values).

    >>> sorted_unique(np.array([5, 1, 5, 3], np.uint64)).tolist()
    [1, 3, 5]
    """
    ordered = np.sort(values)
    if len(ordered) < 2:
        return ordered
    return ordered[np.concatenate([[True], ordered[1:] != ordered[:-1]])]


def sorted_contains(keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """For each of `values`, whether the sorted array `keys` holds it: a binary search
    each, where `np.isin` would sort both arrays again at every call.

    >>> sorted_contains(np.array([2, 5, 9]), np.array([5, 1, 9, 10])).tolist()
    [True, False, True, False]
    """
    if not len(keys):
        return np.zeros(len(values), dtype=bool)
    found = np.minimum(sorted_search(keys, values), len(keys) - 1)
    return keys[found] == values


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

    def add_all(self, ids: Iterable[pa.Array]) -> None:
        """Record every id of `ids` (arrays of an output's ids, read back)."""
        for array in ids:
            self.add_hashes(id_hashes(array))

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

"""The previous output of an incremental run, as a lookup on disk: for each of its
documents, sorted by the hash of its id (keyed by the run's `IdKey`), the hash of its
text, its counts (tokens, truncated) and where its row is (part number, row in the part).

The arrays are `.npy` files in a folder of their own, memory-mapped wherever they are read:
by the run's process, which carries unchanged rows over, and by each tokenizer process,
which leaves unchanged texts untokenized. Their pages are the operating system's cache,
shared by every process and given back under pressure, not memory each process holds.

An id is found by the first word of its hash (`keys`) and confirmed by the second
(`checks`). Ids of the previous output that share a first word (the same id twice, or by
chance: odds about n² / 2⁶⁵) are left out, so those documents are embedded again, as if
new.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from bulkembed.contracts import RowCounts
from bulkembed.sources.filters import sorted_search
from bulkembed.sources.id_keys import IdKey

# The arrays, by file name, and their types.
_ARRAYS: dict[str, np.dtype] = {
    "keys": np.dtype(np.uint64),
    "checks": np.dtype(np.uint64),
    "hashes": np.dtype("S16"),
    "tokens": np.dtype(np.int32),
    "truncated": np.dtype(bool),
    "parts": np.dtype(np.int32),
    "rows": np.dtype(np.int64),
}


@dataclass(frozen=True, slots=True)
class PartRows:
    """One part of the previous output: its ids' hashes ([rows, 2], `IdKey.hashes`), its
    texts' hashes and its rows' counts, in row order."""

    keys: np.ndarray
    hashes: np.ndarray
    counts: RowCounts


class PreviousLookup:
    """The lookup arrays (see the module's docstring), memory-mapped from `folder` where
    they have one, and the `key` their ids were hashed with. Pickled, a lookup is opened
    again from its folder, or as `reopened_by` says where the folder is not at hand
    (another machine of a cluster)."""

    def __init__(
        self,
        arrays: dict[str, np.ndarray],
        key: IdKey,
        folder: Path | None = None,
        reopen: tuple[Callable[..., PreviousLookup], tuple[Any, ...]] | None = None,
    ) -> None:
        self.key = key
        self.folder = folder
        self.keys, self.checks = arrays["keys"], arrays["checks"]
        self.hashes = arrays["hashes"]
        self.tokens, self.truncated = arrays["tokens"], arrays["truncated"]
        self.parts, self.rows = arrays["parts"], arrays["rows"]
        if reopen is None:
            opened = (PreviousLookup.open, (folder, key))
            reopen = opened if folder else (PreviousLookup, (arrays, key))
        self._reopen = reopen

    @classmethod
    def open(cls, folder: Path, key: IdKey) -> PreviousLookup:
        """The lookup in `folder`, memory-mapped."""
        arrays = {name: np.load(folder / f"{name}.npy", mmap_mode="r") for name in _ARRAYS}
        return cls(arrays, key, folder)

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays, by name."""
        return {name: getattr(self, name) for name in _ARRAYS}

    def reopened_by(self, reopen: Callable[..., PreviousLookup], *args: Any) -> PreviousLookup:
        """The same lookup, pickled as the call `reopen(*args)`."""
        return PreviousLookup(self.arrays(), self.key, self.folder, (reopen, args))

    def __reduce__(self) -> tuple[Callable[..., PreviousLookup], tuple[Any, ...]]:
        return self._reopen

    @classmethod
    def build(cls, parts: Iterable[PartRows], folder: Path, key: IdKey) -> PreviousLookup:
        """Sort the rows of `parts` (their ids hashed with `key`) by id hash into `folder`,
        and open it. Each array is joined, then written and let go, one after another: the
        peak holds the joined arrays (49 bytes a row) and the sort order, not copies of all
        of them."""
        pieces: dict[str, list[np.ndarray]] = {name: [] for name in _ARRAYS}
        for number, part in enumerate(parts):
            count = len(part.keys)
            pieces["keys"].append(part.keys[:, 0])
            pieces["checks"].append(part.keys[:, 1])
            pieces["hashes"].append(part.hashes)
            pieces["tokens"].append(part.counts.tokens)
            pieces["truncated"].append(part.counts.truncated)
            pieces["parts"].append(np.full(count, number, np.int32))
            pieces["rows"].append(np.arange(count, dtype=np.int64))
        joined = {name: _joined(pieces.pop(name), _ARRAYS[name]) for name in _ARRAYS}
        keys = joined["keys"]
        # Ids of one first word (the same id twice, or a chance tie) match nothing: both are
        # dropped.
        order = np.argsort(keys)
        keys = keys[order]
        unique = np.ones(len(keys), dtype=bool)
        shared = keys[1:] == keys[:-1]
        unique[1:] &= ~shared
        unique[:-1] &= ~shared
        order = order[unique]
        del keys, unique, shared
        folder.mkdir(parents=True, exist_ok=True)
        for name in _ARRAYS:
            np.save(folder / f"{name}.npy", joined.pop(name)[order])
        return cls.open(folder, key)

    def __len__(self) -> int:
        return len(self.keys)

    def find(self, keys: np.ndarray) -> np.ndarray:
        """For each id of hash in `keys` ([ids, 2], hashed with `key`), its entry in the
        arrays, or -1."""
        if not len(self.keys):
            return np.full(len(keys), -1, dtype=np.int64)
        found = np.minimum(sorted_search(self.keys, keys[:, 0]), len(self.keys) - 1)
        same = (self.keys[found] == keys[:, 0]) & (self.checks[found] == keys[:, 1])
        return np.where(same, found, -1)

    def find_ids(self, ids: pa.Array) -> np.ndarray:
        """`find` for the ids themselves."""
        return self.find(self.key.hashes(ids))

    def same(self, keys: np.ndarray, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The entries of `keys` (`find`), and which of them hold the same text hash."""
        entries = self.find(keys)
        known = entries >= 0
        if not known.any():
            return entries, known
        return entries, known & (self.hashes[np.where(known, entries, 0)] == hashes)

    def counted(self, keys: np.ndarray, hashes: np.ndarray) -> np.ndarray:
        """Which of the documents need no tokenizing: their text is unchanged and their
        counts are known (they are carried over, counted as the previous output counted
        them)."""
        entries, same = self.same(keys, hashes)
        if not same.any():
            return same
        return same & (self.tokens[np.where(same, entries, 0)] >= 0)

    def counts(self, entries: np.ndarray) -> RowCounts:
        return RowCounts(np.asarray(self.tokens[entries]), np.asarray(self.truncated[entries]))


def _joined(arrays: list[np.ndarray], kind: np.dtype) -> np.ndarray:
    """`arrays` as one array of `kind`."""
    if not arrays:
        return np.empty(0, kind)
    return np.concatenate(arrays).astype(kind, copy=False)

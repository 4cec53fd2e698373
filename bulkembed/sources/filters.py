"""Steps between reading and tokenizing: drop repeated ids, stop after a number of documents."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from bulkembed.sources.formats import format_of
from bulkembed.sources.records import DUPLICATE_ID, BadRecord, Chunk, InputFile

# Recent ids live in a Python set; past this many they are merged into a sorted array.
_RECENT_LIMIT = 1 << 20


def id_hash(doc_id: Any) -> int:
    """A 64-bit hash of an id (its decimal form for integers)."""
    return int.from_bytes(hashlib.blake2b(str(doc_id).encode(), digest_size=8).digest(), "little")


class SeenIds:
    """A set of ids in 8 bytes each: 64-bit hashes, so 10 million ids take 80 MB.

    Two different ids share a hash with a probability of about n² / 2⁶⁵ (3 in a million for
    10 million ids); the later one would then be reported as a duplicate, never dropped
    silently."""

    def __init__(self) -> None:
        self._sorted = np.empty(0, dtype=np.uint64)
        self._recent: set[int] = set()

    def _known(self, value: int) -> bool:
        if value in self._recent:
            return True
        position = int(np.searchsorted(self._sorted, np.uint64(value)))
        return position < len(self._sorted) and int(self._sorted[position]) == value

    def add(self, doc_id: Any) -> bool:
        """Record `doc_id`; False if it was already there."""
        value = id_hash(doc_id)
        if self._known(value):
            return False
        self._recent.add(value)
        if len(self._recent) >= _RECENT_LIMIT:
            recent = np.fromiter(self._recent, dtype=np.uint64, count=len(self._recent))
            self._sorted = np.union1d(self._sorted, recent)
            self._recent.clear()
        return True


def drop_duplicate_ids(
    chunks: Iterable[Chunk], seen: SeenIds, files: list[InputFile]
) -> Iterator[Chunk]:
    """Keep the first record of each id (in input order); later ones become bad records."""
    for chunk in chunks:
        ids = chunk.ids.to_pylist()
        keep = [seen.add(doc_id) for doc_id in ids]
        if not all(keep):
            file = files[chunk.file]
            for doc_id, first, position in zip(ids, keep, chunk.positions, strict=True):
                if not first:
                    bad = BadRecord(str(file.path), DUPLICATE_ID, doc_id)
                    if format_of(file).lines:
                        bad.line = position + 1
                    else:
                        bad.row = position
                    chunk.bad.append(bad)
            chunk.keep([i for i, first in enumerate(keep) if first])
        yield chunk


def take(chunks: Iterable[Chunk], limit: int | None) -> Iterator[Chunk]:
    """Stop after `limit` documents (None: no limit); the unit cut short ends there, and
    bad records past the last document taken are not reported."""
    if limit is None:
        yield from chunks
        return
    remaining = limit
    if remaining <= 0:
        return
    for chunk in chunks:
        if len(chunk.texts) >= remaining:
            last = chunk.positions[remaining - 1]
            chunk.keep(slice(0, remaining))
            chunk.bad = [b for b in chunk.bad if b.position is None or b.position < last]
            chunk.last_in_unit = True
            yield chunk
            return
        remaining -= len(chunk.texts)
        yield chunk

"""The types and names that every layer shares: the lowest floor, importing nothing of
bulkembed. Sources, encoders, sinks and the run directory all speak in these."""

from __future__ import annotations

import base64
import binascii
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

import numpy as np

# The run directory inside an output (`OUT/_bulkembed/`, `DB/_bulkembed/TABLE/`).
RUN_DIRECTORY = "_bulkembed"


def part_name(file: int, unit: int) -> str:
    """The name of a unit of work, and of its part: `part-<input file>-<unit>`."""
    return f"part-{file:05d}-{unit:06d}"


def part_unit(part: str) -> tuple[int, int]:
    """(input file, unit) of a part name `part-<input file>-<unit>`."""
    _, file, unit = part.split("-")
    return int(file), int(unit)


@dataclass(frozen=True, slots=True)
class UnitRecord:
    """What a committed unit of work holds; the content of its done-marker.

    `carried` rows were copied from a previous output (`--since`), `changed` of them or of
    the others had another text there; `tokens`, `padded_tokens` and `truncated` count the
    embedded rows, `carried_tokens` and `carried_truncated` the carried ones; `version` is
    where the sink found the unit (a LanceDB table version). A unit of `kept` rows holds
    rows of the previous output that an incremental run did not delete although its input
    did not hold them (their record or file could not be read, or the deletes were held
    back): it has no input of its own. `cut` counts the texts cut before they were
    tokenized (`long_texts`), their vectors those of the whole texts."""

    part: str
    rows: int
    bad_records: int
    truncated: int
    tokens: int
    padded_tokens: int
    carried: int = 0
    changed: int = 0
    carried_tokens: int = 0
    carried_truncated: int = 0
    version: int | None = field(default=None)
    kept: int = 0
    cut: int = 0


@dataclass(frozen=True, slots=True)
class RowCounts:
    """Per row, in order: the tokens the model read (-1: not known, a row kept from a
    previous output that never counted it) and whether its text was truncated. A part
    keeps its rows' counts in its label, so that a later `--since` run carries a row
    without tokenizing its text again."""

    tokens: np.ndarray
    truncated: np.ndarray

    @classmethod
    def unknown(cls, rows: int) -> RowCounts:
        return cls(np.full(rows, -1, np.int32), np.zeros(rows, bool))

    @classmethod
    def joined(cls, counts: Sequence[RowCounts]) -> RowCounts:
        if not counts:
            return cls.unknown(0)
        tokens = np.concatenate([c.tokens for c in counts]).astype(np.int32, copy=False)
        return cls(tokens, np.concatenate([c.truncated for c in counts]).astype(bool))

    def take(self, rows: np.ndarray | slice) -> RowCounts:
        return RowCounts(self.tokens[rows], self.truncated[rows])

    def encode(self) -> str:
        """The counts as text for a label: little-endian int32 tokens, then a byte per
        truncated flag, deflated, in base64 (a few bytes a row).

        >>> RowCounts.decode(RowCounts(np.array([3, -1]), np.array([True, False])).encode(), 2)
        RowCounts(tokens=array([ 3, -1], dtype=int32), truncated=array([ True, False]))
        """
        raw = self.tokens.astype("<i4").tobytes() + self.truncated.astype(np.uint8).tobytes()
        return base64.b64encode(zlib.compress(raw, 1)).decode("ascii")

    @classmethod
    def decode(cls, text: object, rows: int) -> RowCounts | None:
        """Counts of `rows` rows from `encode`'s text; None when they are not there whole."""
        if not isinstance(text, str):
            return None
        try:
            raw = zlib.decompress(base64.b64decode(text, validate=True))
        except (binascii.Error, zlib.error, ValueError):
            return None
        if len(raw) != 5 * rows:
            return None
        tokens = np.frombuffer(raw, "<i4", rows).astype(np.int32)
        return cls(tokens, np.frombuffer(raw, np.uint8, rows, 4 * rows).astype(bool))


@dataclass(frozen=True, slots=True)
class TokenBatch:
    """Token ids of several documents laid end to end, with each document's length; for
    images, their `pixels` (uint8 [images, height, width, 3]), each image as long as the
    tokens it is to the model, its token ids 0."""

    token_ids: np.ndarray
    lengths: np.ndarray
    pixels: np.ndarray | None = None

    @classmethod
    def from_sequences(
        cls, sequences: list[np.ndarray], pixels: np.ndarray | None = None
    ) -> TokenBatch:
        lengths = np.array([len(s) for s in sequences], dtype=np.int32)
        flat = np.concatenate(sequences) if sequences else np.empty(0, np.int32)
        return cls(flat.astype(np.int32, copy=False), lengths, pixels)

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def padded_tokens(self) -> int:
        """Tokens the batch takes padded to its longest document."""
        return len(self.lengths) * int(self.lengths.max()) if len(self.lengths) else 0

    def halves(self) -> tuple[TokenBatch, TokenBatch]:
        """The first half of the documents and the rest."""
        middle = len(self.lengths) // 2
        cut = int(self.lengths[:middle].sum())
        pixels = self.pixels
        return (
            TokenBatch(
                self.token_ids[:cut],
                self.lengths[:middle],
                None if pixels is None else pixels[:middle],
            ),
            TokenBatch(
                self.token_ids[cut:],
                self.lengths[middle:],
                None if pixels is None else pixels[middle:],
            ),
        )


def ragged_positions(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The positions of runs of `lengths` items that begin at `starts`, run after run: each
    item's run start, plus its place in the run.

    >>> ragged_positions(np.array([5, 0]), np.array([2, 3])).tolist()
    [5, 6, 0, 1, 2]
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    ends = np.cumsum(lengths)
    total = int(ends[-1]) if len(ends) else 0
    return np.repeat(np.asarray(starts, np.int64) - (ends - lengths), lengths) + np.arange(total)


@dataclass(frozen=True, slots=True)
class SparseVector:
    """Vocabulary ids (ascending) and their weights: the non-zero entries of a sparse vector."""

    indices: np.ndarray
    values: np.ndarray


@dataclass(frozen=True, slots=True)
class SparseRows(Sequence[SparseVector]):
    """The sparse vectors of several documents in three flat arrays, no object per
    document: `indices` (int32) and `values` (float32) of every entry, document after
    document, and `offsets` [documents + 1] (int64), where each document's entries start,
    then their total. Indexing gives one document's `SparseVector`, iterating each.

    >>> rows = SparseRows.of([SparseVector(np.array([2, 7]), np.array([0.5, 1.0])),
    ...                       SparseVector(np.array([], np.int32), np.array([]))])
    >>> len(rows), rows.offsets.tolist(), rows[0].indices.tolist(), rows[1].values.tolist()
    (2, [0, 2, 2], [2, 7], [])
    >>> rows.take(np.array([1, 0, 0])).offsets.tolist()
    [0, 0, 2, 4]
    """

    indices: np.ndarray
    values: np.ndarray
    offsets: np.ndarray

    @classmethod
    def of(cls, vectors: Iterable[SparseVector]) -> SparseRows:
        """The rows of `vectors`, one document each."""
        vectors = list(vectors)
        counts = [len(v.indices) for v in vectors]
        offsets = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        indices = [np.asarray(v.indices, np.int32) for v in vectors]
        values = [np.asarray(v.values, np.float32) for v in vectors]
        return cls(_joined(indices, np.int32), _joined(values, np.float32), offsets)

    @classmethod
    def concatenate(cls, parts: Sequence[SparseRows]) -> SparseRows:
        """The documents of `parts`, one part after the other."""
        offsets, total = [np.zeros(1, np.int64)], 0
        for part in parts:
            offsets.append(part.offsets[1:] + total)
            total += int(part.offsets[-1])
        indices = _joined([p.indices for p in parts], np.int32)
        values = _joined([p.values for p in parts], np.float32)
        return cls(indices, values, np.concatenate(offsets))

    def take(self, rows: np.ndarray | slice) -> SparseRows:
        """The documents at `rows` (positions or a slice), in that order."""
        # Positions (negative ones from the end), a boolean mask or a slice, as numpy reads them.
        rows = np.arange(len(self), dtype=np.int64)[rows]
        counts = np.diff(self.offsets)[rows]
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        entries = ragged_positions(self.offsets[rows], counts)
        return SparseRows(self.indices[entries], self.values[entries], offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @overload
    def __getitem__(self, row: int) -> SparseVector: ...

    @overload
    def __getitem__(self, row: slice) -> SparseRows: ...

    def __getitem__(self, row: int | slice) -> SparseVector | SparseRows:
        if isinstance(row, slice):
            return self.take(row)
        if not -len(self) <= row < len(self):
            raise IndexError(f"document {row} of {len(self)}")
        row %= len(self)
        start, end = self.offsets[row], self.offsets[row + 1]
        return SparseVector(self.indices[start:end], self.values[start:end])


def _joined(arrays: list[np.ndarray], dtype: type) -> np.ndarray:
    return np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.empty(0, dtype)


@dataclass(frozen=True, slots=True)
class Embeddings:
    """What an encoder returns for a batch, one row per document, in batch order.

    `dense` is a float32 array of shape [documents, D]; `sparse` the documents'
    `SparseRows` (a `SparseVector` each); `multivector` one
    float32 array of shape [kept tokens, d] per document. An output that was not asked for
    is None."""

    dense: np.ndarray | None = None
    sparse: SparseRows | None = None
    multivector: list[np.ndarray] | None = None

    @classmethod
    def concatenate(cls, parts: list[Embeddings]) -> Embeddings:
        """Rows of `parts`, one after the other."""

        def joined(name: str) -> Any:
            pieces = [getattr(p, name) for p in parts]
            if not pieces or any(piece is None for piece in pieces):
                return None
            if name == "dense":
                return np.concatenate(pieces)
            if name == "sparse":
                return SparseRows.concatenate(pieces)
            return [row for piece in pieces for row in piece]

        return cls(joined("dense"), joined("sparse"), joined("multivector"))

    def take(self, rows: np.ndarray | slice) -> Embeddings:
        """The documents at `rows` (positions or a slice), in that order."""

        def pick(values: list | None) -> list | None:
            if values is None:
                return None
            if isinstance(rows, slice):
                return values[rows]
            return [values[i] for i in rows]

        dense = None if self.dense is None else self.dense[rows]
        sparse = None if self.sparse is None else self.sparse.take(rows)
        return Embeddings(dense, sparse, pick(self.multivector))


@dataclass(slots=True)
class DeviceCounts:
    """What embedding counts beside the vectors: batches embedded again in float32, their
    values not finite in half precision; and seconds the device computed batches, timed by
    CUDA events on its compute stream (0 on a CPU, where the host's clock times it)."""

    float32_retries: int = 0
    busy_seconds: float = 0.0

    def add(self, other: DeviceCounts, share: float = 1.0) -> None:
        """Count in `other`, its seconds times `share` (1/N: the mean of N devices)."""
        self.float32_retries += other.float32_retries
        self.busy_seconds += other.busy_seconds * share

    def since(self, before: DeviceCounts) -> DeviceCounts:
        """What was counted after `before` (a copy taken earlier)."""
        return DeviceCounts(
            self.float32_retries - before.float32_retries, self.busy_seconds - before.busy_seconds
        )

    def copy(self) -> DeviceCounts:
        return DeviceCounts(self.float32_retries, self.busy_seconds)

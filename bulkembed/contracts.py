"""The types and names that every layer shares: the lowest floor, importing nothing of
bulkembed. Sources, encoders, sinks and the run directory all speak in these."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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
    back): it has no input of its own."""

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


@dataclass(frozen=True, slots=True)
class TokenBatch:
    """Token ids of several documents laid end to end, with each document's length."""

    token_ids: np.ndarray
    lengths: np.ndarray

    @classmethod
    def from_sequences(cls, sequences: list[np.ndarray]) -> TokenBatch:
        lengths = np.array([len(s) for s in sequences], dtype=np.int32)
        flat = np.concatenate(sequences) if sequences else np.empty(0, np.int32)
        return cls(flat.astype(np.int32, copy=False), lengths)

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
        return (
            TokenBatch(self.token_ids[:cut], self.lengths[:middle]),
            TokenBatch(self.token_ids[cut:], self.lengths[middle:]),
        )


@dataclass(frozen=True, slots=True)
class SparseVector:
    """Vocabulary ids (ascending) and their weights: the non-zero entries of a sparse vector."""

    indices: np.ndarray
    values: np.ndarray


@dataclass(frozen=True, slots=True)
class Embeddings:
    """What an encoder returns for a batch, one row per document, in batch order.

    `dense` is a float32 array of shape [documents, D]; `sparse` one `SparseVector` per
    document; `multivector` one float32 array of shape [kept tokens, d] per document. An
    output that was not asked for is None."""

    dense: np.ndarray | None = None
    sparse: list[SparseVector] | None = None
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
        return Embeddings(dense, pick(self.sparse), pick(self.multivector))


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

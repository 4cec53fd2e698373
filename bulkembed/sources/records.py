"""What flows out of the sources: files, chunks of records, and records set aside."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from bulkembed.contracts import RowCounts, part_name
from bulkembed.errors import InputError
from bulkembed.storage import AnyPath, parquet_file


@dataclass(frozen=True, slots=True)
class InputFile:
    """One input file, local or on object storage. `name` is its path relative to the input
    it was found through; `modified` its modification time in nanoseconds (0 for a streamed
    dataset; for an image folder a digest of its images' names, sizes and times)."""

    path: AnyPath
    name: str
    format: str
    size: int
    modified: int = 0
    # The images of an image folder (`sources.images`), by their paths relative to it.
    members: tuple[str, ...] = ()


# A bad record's `previous` in an incremental run: its id's row is not deleted; no row is
# deleted (its id is unknown).
PREVIOUS_ROW_KEPT = "this id's row is kept"
PREVIOUS_ROWS_KEPT = "its id is unknown: no row is deleted"
# The reason of a record whose id an earlier record has: it is no unknown id.
DUPLICATE_ID = "duplicate id: an earlier record has the same id"


def known_id(value: Any) -> bool:
    """Whether a bad record's id is one a document can have (an integer, or a string of
    valid Unicode): else which document the record was is unknown."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(slots=True)
class BadRecord:
    """A record that cannot be embedded, with where it was and why.

    `row` is a Parquet row index (from 0); `line` a JSONL line number (from 1); neither is
    set when a whole file or the rest of it cannot be read. In an incremental run,
    `previous` says what became of the previous output's rows that the record may have
    held (`PREVIOUS_ROW_KEPT`, `PREVIOUS_ROWS_KEPT`)."""

    source: str
    reason: str
    id: Any = None
    row: int | None = None
    line: int | None = None
    previous: str | None = None

    @property
    def position(self) -> int | None:
        """The record's place in its file, from 0 (row, or line - 1)."""
        return self.row if self.row is not None else (None if self.line is None else self.line - 1)

    def fields(self) -> dict[str, Any]:
        """The fields that are set, as a quarantine line shows them."""
        return {k: getattr(self, k) for k in self.__slots__ if getattr(self, k) is not None}

    def where(self) -> str:
        if self.line is not None:
            return f"{self.source} line {self.line}"
        if self.row is not None:
            return f"{self.source} row {self.row}"
        return self.source


_NO_TEXT = pa.nulls(0, pa.string())
_NO_POSITION = np.empty(0, dtype=np.int64)
_NO_HASH = np.empty(0, dtype="S16")


def _int64_array(values: np.ndarray) -> pa.Array:
    """`values` as an Arrow int64 array on their own buffer: `pa.array` imports pandas on
    its first call (0.2 s), which a run that embeds nothing never needs otherwise."""
    flat = np.ascontiguousarray(values, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(flat), [None, pa.py_buffer(flat)])


@dataclass(slots=True)
class Chunk:
    """Up to `chunk_size` consecutive records of one unit of work.

    `unit` numbers the unit within its file (a Parquet row group, or a range of rows or
    lines); the last chunk of each unit has `last_in_unit` set, even when it holds no row.
    `ids`, `texts` (Arrow arrays), `positions` (int64: row or line number from 0),
    `columns` (passthrough values, `--keep-columns`), `hashes` (the content hashes, 16-byte
    BLAKE2b digests) and `id_hashes` (the ids' keyed hashes, [records, 2], `IdKey`) run in
    parallel, one entry per record; the hashes are computed where the texts are tokenized,
    and the texts dropped there. `carried` holds the records whose embeddings come from a
    previous output instead; `changed` counts the records here whose text differs from that
    output's."""

    file: int
    unit: int
    ids: pa.Array
    texts: pa.Array
    last_in_unit: bool
    bad: list[BadRecord] = field(default_factory=list)
    positions: np.ndarray = field(default_factory=lambda: _NO_POSITION)
    columns: dict[str, pa.Array] = field(default_factory=dict)
    hashes: np.ndarray = field(default_factory=lambda: _NO_HASH)
    id_hashes: np.ndarray | None = None
    carried: Carried | None = None
    changed: int = 0

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def part(self) -> str:
        """The output part of this chunk's unit: `part-<file>-<unit>`."""
        return part_name(self.file, self.unit)

    def rows(self, which: slice | np.ndarray) -> Chunk:
        """The chunk's records at `which` (a slice, or indices in order), with no bad or
        carried ones."""
        if isinstance(which, slice):

            def pick(values: pa.Array) -> pa.Array:
                return values[which]
        else:
            indices = _int64_array(which)

            def pick(values: pa.Array) -> pa.Array:
                return values.take(indices)

        texts = pick(self.texts) if len(self.texts) else self.texts
        hashes = self.hashes[which] if len(self.hashes) else self.hashes
        id_hashes = None if self.id_hashes is None else self.id_hashes[which]
        columns = {k: pick(v) for k, v in self.columns.items()}
        return Chunk(
            self.file,
            self.unit,
            pick(self.ids),
            texts,
            False,
            [],
            self.positions[which],
            columns,
            hashes,
            id_hashes,
        )

    def keep(self, which: slice | np.ndarray) -> None:
        """Keep only the records at `which`; bad records and carried ones stay."""
        rows = self.rows(which)
        self.ids, self.texts, self.positions = rows.ids, rows.texts, rows.positions
        self.columns, self.hashes, self.id_hashes = rows.columns, rows.hashes, rows.id_hashes


@contextlib.contextmanager
def reading_previous(path: AnyPath) -> Iterator[None]:
    """A read of PREV's part at `path`: a part that cannot be read (cut short, damaged,
    gone) stops the run with one line that names it and says what to do."""
    try:
        yield
    except (OSError, pa.ArrowException) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise InputError(
            f"--since: cannot read {path}, a part of the previous output ({reason}): restore "
            "it from a copy, or run without --since to embed every document again"
        ) from e


@dataclass(frozen=True, slots=True)
class PreviousRows:
    """Rows `start` to `stop` (not included) of the previous output's part at `path`, of
    `row_bytes` bytes each there."""

    path: AnyPath
    start: int
    stop: int
    row_bytes: int = 0

    def read(self, columns: list[str]) -> pa.Table:
        """The rows' `columns`: the row groups that hold them, sliced."""
        with reading_previous(self.path):
            file = parquet_file(self.path)
            sizes = [file.metadata.row_group(g).num_rows for g in range(file.num_row_groups)]
            starts = np.cumsum([0, *sizes])
            first = int(np.searchsorted(starts, self.start, side="right")) - 1
            last = int(np.searchsorted(starts, self.stop, side="left"))
            table = file.read_row_groups(range(first, last), columns=columns)
        return table.slice(self.start - int(starts[first]), self.stop - self.start)


# What a record of `Carried` is: carried over from a previous output, or saved by an
# interrupted run (its text cut before it was tokenized, or not).
CARRIED_OVER, SAVED, SAVED_CUT = 0, 1, 2


@dataclass(slots=True)
class Carried:
    """Records whose text is unchanged since a previous output, their output columns from
    it (`embeddings`: dense, sparse, multivector as that output wrote them) and their
    counts. Where they are `source`, rows of one part of it in order, `embeddings` may be
    None: read only if the rows are written (their unit's part is not carried over whole).
    `saved` marks, per record, those not carried over but embedded by this run before it
    was interrupted (`bulkembed.engine.saved`: `SAVED`, or `SAVED_CUT` for a text cut before
    it was tokenized); they count as embedded. None: every record is carried over."""

    records: Chunk
    embeddings: pa.Table | None
    counts: RowCounts
    source: PreviousRows | None = None
    saved: np.ndarray | None = None

    @property
    def saved_rows(self) -> np.ndarray:
        """Which records were saved by an interrupted run (a boolean mask)."""
        if self.saved is None:
            return np.zeros(len(self.records.positions), dtype=bool)
        return self.saved != CARRIED_OVER

    def _saved_at(self, rows: slice) -> np.ndarray | None:
        return None if self.saved is None else self.saved[rows]

    @property
    def nbytes(self) -> int:
        """What the records' output columns take, in hand or, for those read later, in the
        previous output: windows and read-ahead weigh them alike."""
        if self.embeddings is not None:
            return int(self.embeddings.nbytes)
        assert self.source is not None
        return (self.source.stop - self.source.start) * self.source.row_bytes

    def read(self, columns: list[str]) -> pa.Table:
        """The output columns of the records, read from `source` if they are not in hand."""
        if self.embeddings is not None:
            return self.embeddings.select(columns)
        assert self.source is not None, "carried records come with their vectors or rows"
        return self.source.read(columns)

    def before(self, position: int) -> tuple[Carried | None, Carried | None]:
        """The records before input position `position`, and the others (None: none)."""
        assert self.embeddings is not None, "records to embed come with carried vectors"
        cut = int(np.searchsorted(self.records.positions, position))
        if cut == 0:
            return None, self
        if cut == len(self.records.positions):
            return self, None
        head, tail = slice(0, cut), slice(cut, None)
        return (
            Carried(
                self.records.rows(head),
                self.embeddings.slice(0, cut),
                self.counts.take(head),
                saved=self._saved_at(head),
            ),
            Carried(
                self.records.rows(tail),
                self.embeddings.slice(cut),
                self.counts.take(tail),
                saved=self._saved_at(tail),
            ),
        )


@dataclass(slots=True)
class Rows:
    """Records collected for the chunk being built; `values` holds passthrough values of
    records read as Python objects (JSON lines), by column."""

    ids: list[Any] = field(default_factory=list)
    # Texts, or images (`image_columns.image_value`).
    texts: list[Any] = field(default_factory=list)
    bad: list[BadRecord] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    values: dict[str, list[Any]] = field(default_factory=dict)
    text_bytes: int = 0

    def __len__(self) -> int:
        return len(self.texts) + len(self.bad)

    def add(self, doc_id: Any, text: Any, position: int) -> None:
        self.ids.append(doc_id)
        self.texts.append(text)
        self.positions.append(position)
        self.text_bytes += len(text) if isinstance(text, str) else 0

    def drop(self, indices: set[int]) -> list[tuple[Any, int]]:
        """Remove the records at `indices`; return their (id, position) pairs."""
        removed = [(self.ids[i], self.positions[i]) for i in sorted(indices)]
        keep = [i for i in range(len(self.ids)) if i not in indices]
        self.ids = [self.ids[i] for i in keep]
        self.texts = [self.texts[i] for i in keep]
        self.positions = [self.positions[i] for i in keep]
        self.values = {k: [v[i] for i in keep] for k, v in self.values.items()}
        return removed

    def chunk(
        self,
        file: int,
        unit: int,
        last_in_unit: bool,
        id_type: pa.DataType,
        columns: dict[str, pa.Array] | None = None,
        contents: pa.DataType | None = None,
    ) -> Chunk:
        """The records as a chunk, their texts (or images) as an array of `contents`
        (None: strings)."""
        ids = self.ids if pa.types.is_integer(id_type) else [str(i) for i in self.ids]
        return Chunk(
            file,
            unit,
            pa.array(ids, type=id_type),
            pa.array(self.texts, contents or pa.string()),
            last_in_unit,
            self.bad,
            np.array(self.positions, dtype=np.int64),
            columns or {},
        )

"""Vectors that an interrupted run saved, and the next run's use of them.

When SIGINT or SIGTERM stops a run (`bulkembed.engine.stopping`), the documents it embedded
whose units are not committed (rows of parts still open, documents of a window embedded in
part) are saved in the run directory, in one Parquet file of their own,
`saved-<16 hex digits>.parquet`: their rows as the output stores them (the part schema),
each with the input file and position it came from (`_file`, `_position`). The next run
of the same command (the same fingerprint: the same model, settings and inputs) takes
each record that it finds there, by file, position and content hash, out of the
documents to embed: its vectors come from the file (`Carried.saved`), and it counts as
embedded. The files go once every unit is done.

Saving is for the run's own process: one device, or the CPU. Rows saved are bounded by
the open units and one window; a part kept open past `OPEN_PART_BYTES` is not kept in
memory for saving, and its rows are embedded again after an interrupt.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bulkembed.batching.tokenize import CUT
from bulkembed.contracts import Embeddings, RowCounts
from bulkembed.errors import BulkembedError
from bulkembed.run_dir.saved_files import saved_documents, saved_files
from bulkembed.schema import CONTENT_HASH, EMBEDDING_COLUMNS, hex_strings, record_batch
from bulkembed.sources import count_records
from bulkembed.sources.records import SAVED, SAVED_CUT, Carried, Chunk
from bulkembed.wording import counted

if TYPE_CHECKING:
    from bulkembed.batching.tokenize import TokenizedChunk
    from bulkembed.run_dir import RunDirectory
    from bulkembed.sources import InputFile
    from bulkembed.storage import AnyPath

FILE_COLUMN = "_file"
POSITION_COLUMN = "_position"
PART_COLUMN = "_part"
# A part's rows are kept in memory for saving up to this size (a unit of ColBERT vectors
# may be larger than that): past it, they are embedded again after an interrupt.
OPEN_PART_BYTES = 256 * 1024 * 1024


def _placed(batch: pa.RecordBatch, part: str, file: int, positions: np.ndarray) -> pa.RecordBatch:
    """`batch` with the unit, input file and positions of its rows."""
    placed = batch.append_column(PART_COLUMN, pa.array([part] * batch.num_rows, pa.string()))
    files = pa.array(np.full(batch.num_rows, file, np.int32))
    placed = placed.append_column(FILE_COLUMN, files)
    return placed.append_column(POSITION_COLUMN, pa.array(positions, pa.int64()))


class OpenRows:
    """The embedded rows of each part not committed yet, as written, for saving them if
    the run is interrupted; a part's are let go at its commit (`drop`)."""

    def __init__(self) -> None:
        self._rows: dict[str, list[pa.RecordBatch] | None] = {}
        self._bytes: dict[str, int] = {}

    def add(self, part: str, batch: pa.RecordBatch, file: int, positions: np.ndarray) -> None:
        """Rows of `part`, from input `file` at `positions`."""
        kept = self._rows.setdefault(part, [])
        if kept is None:
            return
        size = self._bytes.get(part, 0) + batch.nbytes
        if size > OPEN_PART_BYTES:
            self._rows[part] = None
            return
        self._bytes[part] = size
        kept.append(_placed(batch, part, file, positions))

    def drop(self, part: str) -> None:
        """`part` is committed."""
        self._rows.pop(part, None)
        self._bytes.pop(part, None)

    def batches(self) -> list[pa.RecordBatch]:
        """The rows kept of every open part."""
        return [b for kept in self._rows.values() if kept for b in kept]


def window_rows(
    chunks: list[TokenizedChunk], rows: np.ndarray, vectors: Embeddings, schema: pa.Schema
) -> list[pa.RecordBatch]:
    """The rows of `schema`, placed, of the window's documents at `rows` (positions among
    its documents, in order), whose vectors are `vectors` (as the output stores them)."""
    batches, start, taken = [], 0, 0
    for tokenized in chunks:
        end = start + len(tokenized.lengths)
        mine = rows[(rows >= start) & (rows < end)] - start
        if len(mine):
            chunk = tokenized.chunk
            records = chunk.rows(mine)
            embeddings = vectors.take(slice(taken, taken + len(mine)))
            batch = record_batch(records.ids, embeddings, schema, records.hashes, records.columns)
            batches.append(_placed(batch, chunk.part, chunk.file, records.positions))
            taken += len(mine)
        start = end
    return batches


def save_rows(meta: AnyPath, batches: list[pa.RecordBatch]) -> int:
    """Write `batches` (placed rows of one schema) into a new saved file in the run
    directory `meta`, whole or not at all; the number of rows saved."""
    rows = sum(b.num_rows for b in batches)
    if not rows:
        return 0
    table = pa.Table.from_batches(batches)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    data = sink.getvalue().to_pybytes()
    path = meta / f"saved-{secrets.token_hex(8)}.parquet"
    if not isinstance(path, Path):
        path.write_bytes(data)
        return rows
    temporary = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    with open(temporary, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)
    return rows


@dataclass(frozen=True, slots=True)
class KeptDocuments:
    """What an unfinished run keeps: documents in units done, documents saved by an
    interrupted run, and those that remain to embed (None: the inputs cannot be counted)."""

    done: int
    saved: int
    remaining: int | None

    def describe(self) -> str:
        """`1,200 documents kept (1,000 in units done, 200 saved for the next run), 800 remain`."""
        kept = counted(self.done + self.saved, "document")
        line = f"{kept} kept ({self.done:,} in units done, {self.saved:,} saved for the next run)"
        return line if self.remaining is None else f"{line}, {self.remaining:,} remain"


def kept_documents(run: RunDirectory, files: list[InputFile]) -> KeptDocuments:
    """What the unfinished run of `run` keeps, of the records of `files`."""
    units = run.done_units()
    done = units.values()
    finished = sum(r.rows + r.bad_records for r in done)
    saved = saved_documents(run.meta, units)
    try:
        total: int | None = count_records(files)
    except BulkembedError:
        total = None
    remaining = None if total is None else max(0, total - finished - saved)
    return KeptDocuments(sum(r.rows for r in done), saved, remaining)


class SavedVectors:
    """The rows of the saved files of a run directory, found by input file and position."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table
        files = table.column(FILE_COLUMN).to_numpy()
        positions = table.column(POSITION_COLUMN).to_numpy()
        pairs = zip(files.tolist(), positions.tolist(), strict=True)
        self._rows = {pair: row for row, pair in enumerate(pairs)}
        self._hashes = table.column(CONTENT_HASH).to_numpy(zero_copy_only=False)
        self._vectors = [c for c in EMBEDDING_COLUMNS if c in table.column_names]

    def __len__(self) -> int:
        return len(self._rows)

    @classmethod
    def open(
        cls, run: RunDirectory, done: Collection[str], warn: Callable[[str], None]
    ) -> SavedVectors | None:
        """The saved rows of the run directory `run` whose units are not in `done`; None
        where there are none. A saved file that cannot be read (cut short by a crash, an
        upload stopped) is removed, with a warning: its documents are embedded again."""
        tables = []
        for path in saved_files(run.meta):
            try:
                table = pq.read_table(pa.BufferReader(path.read_bytes()))
            except (OSError, pa.ArrowException) as e:
                warn(f"{path} cannot be read ({e}): removed; its documents are embedded again")
                path.unlink(missing_ok=True)
                continue
            parts = pc.is_in(table.column(PART_COLUMN), pa.array(sorted(done), pa.string()))
            tables.append(table.filter(pc.invert(parts)))
        if not tables or not sum(t.num_rows for t in tables):
            return None
        return cls(pa.concat_tables(tables, promote_options="default"))

    def carry(self, chunks: Iterable[TokenizedChunk]) -> Iterator[TokenizedChunk]:
        """Move the records of each chunk that were saved, with the same content hash, to
        `carried` (`Carried.saved`), their vectors from the saved rows, beside those the
        chunk carries over from a previous output (`--since`)."""
        for tokenized in chunks:
            chunk = tokenized.chunk
            carried = chunk.carried
            # Rows carried whole from a previous part (read only if written) stay apart.
            if len(chunk.ids) and (carried is None or carried.embeddings is not None):
                found = self._found(chunk.file, chunk.positions, chunk.hashes)
                if len(found[0]):
                    self._move(tokenized, *found)
            yield tokenized

    def _found(
        self, file: int, positions: np.ndarray, hashes: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Which records (indices) were saved with the same content, and their rows."""
        rows = np.array([self._rows.get((file, int(p)), -1) for p in positions], np.int64)
        which = np.flatnonzero(rows >= 0)
        if len(which):
            mine = hex_strings(hashes[which]).to_numpy(zero_copy_only=False)
            same = self._hashes[rows[which]] == mine
            which = which[same]
        return which, rows[which]

    def _move(self, tokenized: TokenizedChunk, which: np.ndarray, rows: np.ndarray) -> None:
        """The records at `which` of the chunk, saved at `rows`, into its `carried`."""
        chunk = tokenized.chunk
        counts = RowCounts(tokenized.lengths[which], tokenized.truncated_rows[which])
        marks = np.full(len(which), SAVED, np.int8)
        if tokenized.read is not None:
            marks[tokenized.read[which] == CUT] = SAVED_CUT
        vectors = self.table.take(pa.array(rows, pa.int64())).select(self._vectors)
        saved = Carried(chunk.rows(which), vectors, counts, saved=marks)
        chunk.carried = saved if chunk.carried is None else _joined(chunk.carried, saved)
        others = np.ones(len(tokenized.lengths), dtype=bool)
        others[which] = False
        tokenized.keep(np.flatnonzero(others))


def _joined(carried: Carried, saved: Carried) -> Carried:
    """The records of both, in input order (`carried`: from a previous output, its vectors
    in hand)."""
    assert carried.embeddings is not None and saved.embeddings is not None
    a, b = carried.records, saved.records
    order = np.argsort(np.concatenate([a.positions, b.positions]), kind="stable")
    taken = pa.array(order, pa.int64())

    def both(x: pa.Array, y: pa.Array) -> pa.Array:
        return pa.concat_arrays([x, y.cast(x.type)]).take(taken)

    id_hashes = None
    if a.id_hashes is not None and b.id_hashes is not None:
        id_hashes = np.concatenate([a.id_hashes, b.id_hashes])[order]
    records = Chunk(
        a.file,
        a.unit,
        both(a.ids, b.ids),
        a.texts[:0],
        False,
        [],
        np.concatenate([a.positions, b.positions])[order],
        {name: both(a.columns[name], b.columns[name]) for name in a.columns},
        np.concatenate([a.hashes, b.hashes])[order],
        id_hashes,
    )
    names = carried.embeddings.column_names
    vectors = pa.concat_tables(
        [carried.embeddings, saved.embeddings.select(names).cast(carried.embeddings.schema)]
    ).take(taken)
    counts = RowCounts.joined([carried.counts, saved.counts]).take(order)
    marks = np.concatenate([np.zeros(len(a.positions), np.int8), saved.saved])[order]
    assert carried.saved is None, "a chunk's saved records are taken once"
    return Carried(records, vectors, counts, saved=marks)

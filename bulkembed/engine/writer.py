"""Write embedded chunks into their units' parts, and commit each finished unit.

Chunks arrive in input order. Rows go into their unit's part, with rows carried over from a
previous output put back among them in input order; when a unit's last chunk is written,
its part is committed (labelled with the run's id and the unit's counts and bad records, so
that a lost marker can be taken back from it), and then the run directory is told: its bad
records go to the quarantine and its done-marker, with the same counts and bad records, to
the ledger. With several devices each device's process writes and commits its own parts,
and tells the run's process, which keeps the ledger. A run mode that keeps the embedded
rows elsewhere too (`--since`: its change set, see `bulkembed.engine.modes`) derives its
writer.
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any, Generic, TypeVar

import numpy as np
import pyarrow as pa

from bulkembed.batching.tokenize import TokenizedChunk
from bulkembed.contracts import Embeddings, RowCounts, UnitRecord, part_name
from bulkembed.engine.saved import OpenRows
from bulkembed.schema import CONTENT_HASH, hex_strings, record_batch
from bulkembed.sinks import Sink
from bulkembed.sources.records import SAVED_CUT, BadRecord, Carried

Item = TypeVar("Item")
# A part's label keeps its unit's bad records up to this size (Parquet readers refuse footers
# of 100 MB); past it a part whose marker is lost cannot be taken back.
LABEL_BAD_RECORDS_BYTES = 1 << 20


@dataclass(slots=True)
class _Tally:
    """Counts for the unit being written."""

    rows: int = 0
    bad_records: int = 0
    truncated: int = 0
    tokens: int = 0
    padded_tokens: int = 0
    carried: int = 0
    changed: int = 0
    carried_tokens: int = 0
    carried_truncated: int = 0
    cut: int = 0


def _carried_batch(carried: Carried, schema: pa.Schema) -> pa.RecordBatch:
    """Rows for `schema` from carried-over records: embeddings from the previous output,
    ids, hashes and passthrough values from this input."""
    records = carried.records
    named = {"id", CONTENT_HASH, *records.columns}
    embeddings = carried.read([f.name for f in schema if f.name not in named])
    columns = []
    for field in schema:
        if field.name == "id":
            columns.append(records.ids)
        elif field.name == CONTENT_HASH:
            columns.append(hex_strings(records.hashes))
        elif field.name in records.columns:
            columns.append(records.columns[field.name])
        else:
            columns.append(embeddings.column(field.name).combine_chunks())
    return pa.RecordBatch.from_arrays(columns, schema=schema)


# What is told of a committed unit: its record and its bad records.
Committed = Callable[[UnitRecord, list[dict[str, Any]]], None]
# A part's label (`Sink.commit`).
Label = dict[str, Any]


class PartWriter:
    """Writes embedded chunks in input order and commits finished units, labelled with the
    run's id (`run_id`); `committed` is told of each unit once its part is in place (the run
    directory's `RunDirectory.committed`: quarantine, then done-marker). The sinks run
    `fence` right before each commit, and it raises if the run no longer holds the output
    (a lost lease). A subclass may keep each unit's embedded rows elsewhere too
    (`embedded`)."""

    def __init__(
        self,
        run_id: str,
        sink: Sink,
        schema: pa.Schema,
        committed: Committed,
        fence: Callable[[], None],
    ) -> None:
        self.run_id = run_id
        self.committed = committed
        self.schema = schema
        self.sink = sink
        self.tallies: dict[str, _Tally] = {}
        # Bad records go to the quarantine with their unit's commit, so that a unit written
        # twice (a Ray actor lost halfway) does not report them twice.
        self.bad: dict[str, list[BadRecord]] = {}
        # Each row's counts, in the order of the unit's part (kept in its label).
        self.counts: dict[str, list[RowCounts]] = {}
        # Records carried over whose vectors are not read yet: the first of their units,
        # rows of one part of the previous output in order (`Carried.source`).
        self.deferred: dict[str, list[Carried]] = {}
        # The run's own process keeps the rows of open parts, to save them if interrupted.
        self.open_rows: OpenRows | None = None
        sink.start(schema, fence)

    def write(self, tokenized: TokenizedChunk, embeddings: Embeddings, padded: np.ndarray) -> None:
        chunk = tokenized.chunk
        carried = chunk.carried
        tally = self.tallies.setdefault(chunk.part, _Tally())
        self.bad.setdefault(chunk.part, []).extend(chunk.bad)
        batches, counts = [], []
        if carried is not None and carried.embeddings is None:
            self.deferred.setdefault(chunk.part, []).append(carried)
            counts.append(carried.counts)
            tally.rows += len(carried.records.positions)
        elif len(chunk.ids) or carried is not None:
            self._write_deferred(chunk.part)
        if len(chunk.ids):
            batches.append(
                record_batch(chunk.ids, embeddings, self.schema, chunk.hashes, chunk.columns)
            )
            counts.append(RowCounts(tokenized.lengths, tokenized.truncated_rows))
            self.embedded(chunk.part, batches[0])
            if self.open_rows is not None:
                self.open_rows.add(chunk.part, batches[0], chunk.file, chunk.positions)
        saved = None if carried is None else carried.saved_rows
        if carried is not None and carried.embeddings is not None:
            batches.append(_carried_batch(carried, self.schema))
            counts.append(carried.counts)
            if saved is not None and saved.any():
                self.embedded(chunk.part, batches[-1].filter(pa.array(saved)))
        if len(batches) > 1:
            assert carried is not None
            positions = np.concatenate([chunk.positions, carried.records.positions])
            order = np.argsort(positions, kind="stable")
            rows = pa.Table.from_batches(batches).take(pa.array(order, pa.int64()))
            batches = rows.combine_chunks().to_batches()
            counts = [RowCounts.joined(counts).take(order)]
        self.counts.setdefault(chunk.part, []).extend(counts)
        for batch in batches:
            self.sink.write(chunk.part, batch)
            tally.rows += batch.num_rows
        tally.changed += chunk.changed
        tally.bad_records += len(chunk.bad)
        tally.truncated += tokenized.truncated
        tally.tokens += int(tokenized.lengths.sum())
        tally.padded_tokens += int(padded.sum())
        if carried is not None and saved is not None:
            # Embedded by this run before an interrupt: counted as embedded, unpadded.
            tokens = int(carried.counts.tokens[saved].sum())
            tally.tokens += tokens
            tally.padded_tokens += tokens
            tally.truncated += int(carried.counts.truncated[saved].sum())
            tally.cut += int((carried.saved == SAVED_CUT).sum()) if carried.saved is not None else 0
            tally.carried += int((~saved).sum())
        tally.carried_tokens += tokenized.carried_tokens
        tally.carried_truncated += tokenized.carried_truncated
        tally.cut += tokenized.cut
        if chunk.last_in_unit:
            record = UnitRecord(chunk.part, **asdict(self.tallies.pop(chunk.part)))
            rows = RowCounts.joined(self.counts.pop(chunk.part, []))
            self.commit(record, [b.fields() for b in self.bad.pop(chunk.part)], rows)

    def embedded(self, part: str, batch: pa.RecordBatch) -> None:
        """The rows of `part` that the model embedded (not carried over), as they are
        written; the part writer keeps them in the part alone."""

    def label(self, record: UnitRecord, bad: list[dict[str, Any]], counts: RowCounts) -> Label:
        """The label of the part of `record`: the run's id, the unit's counts and `bad`,
        its bad records (while they are small), and its rows' counts."""
        kept = bad if len(json.dumps(bad, default=str)) <= LABEL_BAD_RECORDS_BYTES else None
        return {
            "run": self.run_id,
            "unit": {**asdict(record), "bad": kept},
            "counts": counts.encode(),
        }

    def _write_deferred(self, part: str) -> None:
        """Write the records of `part` carried over without their vectors, read now."""
        for carried in self.deferred.pop(part, []):
            self.sink.write(part, _carried_batch(carried, self.schema))

    def commit(self, record: UnitRecord, bad: list[dict[str, Any]], counts: RowCounts) -> None:
        """Commit the part of `record`, labelled (`label`); then tell `committed`. A unit
        whose rows are all carried over without their vectors is, if they are a part of the
        previous output whole, a copy of it (`Sink.adopt`)."""
        label = self.label(record, bad, counts)
        if self._adopted(record, label):
            found: dict[str, Any] = {}
        else:
            self._write_deferred(record.part)
            found = self.sink.commit(record.part, label)
        if self.open_rows is not None:
            self.open_rows.drop(record.part)
        self.committed(replace(record, **found), bad)

    def _adopted(self, record: UnitRecord, label: dict[str, Any]) -> bool:
        """Whether the unit's part is a copy of a part of the previous output: its rows are
        all carried over without their vectors, and are that part whole."""
        deferred = self.deferred.get(record.part)
        source = deferred[-1].source if deferred else None
        if source is None or source.stop != record.rows:
            return False
        if not self.sink.adopt(record.part, source.path, record.rows, label):
            return False
        del self.deferred[record.part]
        return True

    def close(self) -> None:
        self.sink.close()


class KeptUnits:
    """Rows of the previous output that an incremental run keeps with no input unit to hold
    them (`bulkembed.incremental.deletions`), written once every input unit is done, as units of
    their own through `writer`: `part-<file>-<n>`, where `file` is one past the last input file, of
    up to `per_unit` rows each."""

    def __init__(self, writer: PartWriter, file: int, per_unit: int) -> None:
        self.writer = writer
        self.file = file
        self.per_unit = per_unit
        self.units = 0
        self._pending: list[pa.Table] = []
        self._rows = 0

    def add(self, rows: pa.Table) -> None:
        """Keep `rows`; a unit is committed each time `per_unit` rows are in hand."""
        while rows.num_rows:
            taken = rows.slice(0, self.per_unit - self._rows)
            self._pending.append(taken)
            self._rows += taken.num_rows
            rows = rows.slice(taken.num_rows)
            if self._rows == self.per_unit:
                self._commit()

    def _commit(self) -> None:
        part = part_name(self.file, self.units)
        for table in self._pending:
            for batch in table.to_batches():
                self.writer.sink.write(part, batch)
        record = UnitRecord(part, self._rows, 0, 0, 0, 0, kept=self._rows)
        self.writer.commit(record, [], RowCounts.unknown(self._rows))
        self.units += 1
        self._pending, self._rows = [], 0

    def finish(self) -> None:
        """Commit the last unit, if it holds any row."""
        if self._rows:
            self._commit()


def write_window(
    writer: PartWriter, window: list[TokenizedChunk], embedded: Embeddings, padded: np.ndarray
) -> Iterator[None]:
    """Write an embedded window chunk by chunk (its vectors in input order), yielding after
    each: `WriteBehind` may stop between them."""
    offset = 0
    for tokenized in window:
        end = offset + len(tokenized.lengths)
        writer.write(tokenized, embedded.take(slice(offset, end)), padded[offset:end])
        offset = end
        yield


class WriteBehind(Generic[Item]):
    """Runs `write` on a thread, item after item in the order given, while the caller goes
    on: the next window is embedded while the last one is written.

    `write(item)` yields between its steps (chunks). At most one item is in hand at a time,
    so memory holds two windows (one being written, one being embedded). An error in `write`
    is raised in the caller at the next `submit` or at `finish`. Leaving the `with` block on
    an error stops the thread at the next step: items not written yet are dropped, as they
    would be by a crash, and rerunning the command embeds them again."""

    def __init__(self, write: Callable[[Item], Iterator[None]]) -> None:
        self._write = write
        self._items: queue.Queue[tuple[Item] | None] = queue.Queue()
        self._error: BaseException | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._drain, name="bulkembed-writer", daemon=True)

    def __enter__(self) -> WriteBehind[Item]:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is not None:
            self._stopping.set()
        self._items.put(None)
        self._thread.join()

    def _drain(self) -> None:
        while (item := self._items.get()) is not None:
            try:
                for _ in self._write(item[0]):
                    if self._stopping.is_set() or self._error is not None:
                        break
            except BaseException as e:  # handed to the caller's thread
                self._error = e
            finally:
                self._items.task_done()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def submit(self, item: Item) -> None:
        """Write `item` once the item before it is written."""
        self._items.join()
        self._raise()
        self._items.put((item,))

    def finish(self) -> None:
        """Wait until every item is written; raise the error of one that failed."""
        self._items.join()
        self._raise()

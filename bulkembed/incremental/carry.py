"""Carrying unchanged rows over from a previous output (`--since PREV`), chunk by chunk.

`CarryOver` needs only PREV's lookup (`bulkembed.incremental.lookup`) and the paths of its parts, so
it runs wherever chunks are tokenized: in the run's process, or pickled into a Ray task (its lookup
is then read from Ray's object store). PREV's vectors are read a row group at a time, as the records
that need them come; the run's own order of units usually matches PREV's, so each row group is read
once.

Records that are, so far in their unit, the rows of one of PREV's parts from its first, in
order, are carried without their vectors (`Carried.source`): a unit found to be such a part
whole is committed as a copy of it (`Sink.adopt`), and the vectors of the others are read
when they are written.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from bulkembed.schema import EMBEDDING_COLUMNS
from bulkembed.sinks import PreviousParts
from bulkembed.sources import BadRecord
from bulkembed.sources.records import (
    DUPLICATE_ID,
    PREVIOUS_ROW_KEPT,
    PREVIOUS_ROWS_KEPT,
    Carried,
    PreviousRows,
    known_id,
)

if TYPE_CHECKING:
    from bulkembed.batching.tokenize import TokenizedChunk
    from bulkembed.incremental.lookup import PreviousLookup
    from bulkembed.sinks import OutputRows
    from bulkembed.sources import Chunk

# PREV's row groups held in memory at once.
_CACHED_GROUPS = 4


class CarryOver:
    """Carries the unchanged records of each chunk over from PREV, whose documents `lookup`
    holds (None: a run with no previous output, which carries nothing) and whose parts are
    `parts`; with `keeps_unread` (the run keeps PREV's rows it cannot read: a change set, a
    sync), bad records say that PREV's rows they may have held are kept."""

    def __init__(
        self,
        lookup: PreviousLookup | None,
        parts: PreviousParts | None = None,
        keeps_unread: bool = False,
    ) -> None:
        self.lookup = lookup
        self.parts = PreviousParts([]) if parts is None else parts
        self.keeps_unread = keeps_unread
        self._cache: OrderedDict[tuple[int, int], pa.Table] = OrderedDict()
        # For each unit whose records so far are the rows of one part of PREV from its
        # first, in order: that part and its next row (None: the unit is not).
        self._whole: dict[str, tuple[int, int] | None] = {}

    def __getstate__(self) -> dict[str, Any]:
        """What travels to another process: no cached row group."""
        return {"lookup": self.lookup, "parts": self.parts, "keeps_unread": self.keeps_unread}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["lookup"], state["parts"], state["keeps_unread"])  # type: ignore[misc]

    def sharing(self, lookup: PreviousLookup) -> CarryOver:
        """The same carrier, reading `lookup` (the same arrays, reached another way)."""
        return CarryOver(lookup, self.parts, self.keeps_unread)

    def carry(self, chunks: Iterable[TokenizedChunk]) -> Iterator[TokenizedChunk]:
        """Move each chunk's unchanged records to `carried`, count its changed ones, and
        note on its bad records what `keeps_unread` says."""
        lookup = self.lookup
        if lookup is None:
            yield from chunks
            return
        for tokenized in chunks:
            chunk = tokenized.chunk
            if self.keeps_unread:
                self._note_kept(lookup, chunk.bad)
            assert chunk.id_hashes is not None, "ids are hashed where they are tokenized"
            entries, same = lookup.same(chunk.id_hashes, chunk.hashes)
            chunk.changed = int(((entries >= 0) & ~same).sum())
            untokenized = tokenized.untokenized
            assert untokenized is None or not (untokenized & ~same).any(), "left untokenized"
            source = self._source(chunk, entries, same)
            if same.any():
                unchanged = np.flatnonzero(same)
                counts = tokenized.counts(unchanged, lookup.counts(entries[unchanged]))
                records = chunk.rows(unchanged)
                embeddings = None if source else self.embeddings(entries[unchanged])
                chunk.carried = Carried(records, embeddings, counts, source)
                tokenized.count_as_carried(unchanged, counts)
            yield tokenized

    def _source(self, chunk: Chunk, entries: np.ndarray, same: np.ndarray) -> PreviousRows | None:
        """The rows of PREV that the records of `chunk` are, where they go on the rows its
        unit's earlier records are, of one part of PREV from its first row, a part that may
        be copied whole (`PreviousParts.row_bytes`): every record unchanged, no passthrough
        column, in PREV's order."""
        unit = chunk.part
        run = self._whole.pop(unit, (-1, 0))
        if run is not None and len(entries):
            run = self._continued(run, chunk, entries, same)
        if not chunk.last_in_unit:
            self._whole[unit] = run
        if run is None or not len(entries):
            return None
        number, stop = run
        size = self.parts.row_bytes(number)
        assert size is not None
        return PreviousRows(self.parts.paths[number], stop - len(entries), stop, size)

    def _continued(
        self, run: tuple[int, int], chunk: Chunk, entries: np.ndarray, same: np.ndarray
    ) -> tuple[int, int] | None:
        """`run` (a part of PREV and its next row; (-1, 0) before a unit's first record)
        gone on by the records of `chunk`, or None where they do not go on it."""
        if chunk.columns or not same.all():
            return None
        assert self.lookup is not None
        numbers = self.lookup.parts[entries]
        rows = self.lookup.rows[entries]
        number, start = run if run[0] >= 0 else (int(numbers[0]), 0)
        stop = start + len(entries)
        if (numbers != number).any() or (rows != np.arange(start, stop)).any():
            return None
        return None if self.parts.row_bytes(number) is None else (number, stop)

    @staticmethod
    def _note_kept(lookup: PreviousLookup, bad: list[BadRecord]) -> None:
        """Say of each bad record that PREV's rows it may hold are not deleted: its id's
        row, if PREV has the id; any row, if its id is unknown."""
        named = [r for r in bad if r.reason != DUPLICATE_ID and known_id(r.id)]
        for record in bad:
            if record.reason != DUPLICATE_ID and not known_id(record.id):
                record.previous = PREVIOUS_ROWS_KEPT
        if not named:
            return
        found = lookup.find_ids(pa.array([str(r.id) for r in named], pa.string()))
        for record, entry in zip(named, found, strict=True):
            if entry >= 0:
                record.previous = PREVIOUS_ROW_KEPT

    def embeddings(self, entries: np.ndarray) -> pa.Table:
        """PREV's output columns for lookup entries, in their order: a `take` from each
        row group, for each run of entries in one row group."""
        assert self.lookup is not None
        numbers = np.asarray(self.lookup.parts[entries])
        rows = np.asarray(self.lookup.rows[entries])
        tables = []
        for start, end in _runs(numbers):
            number = int(numbers[start])
            starts = self.parts.group_starts(number)
            part_rows = rows[start:end]
            groups = np.searchsorted(starts, part_rows, side="right") - 1
            for first, last in _runs(groups):
                group = int(groups[first])
                offsets = pa.array(part_rows[first:last] - starts[group], pa.int64())
                tables.append(self._group(number, group).take(offsets))
        return pa.concat_tables(tables)

    def _group(self, number: int, group: int) -> pa.Table:
        """The output columns of one row group of PREV's part `number`."""
        key = (number, group)
        table = self._cache.get(key)
        if table is None:
            table = self.parts.group(number, group)
            self._cache[key] = table
            if len(self._cache) > _CACHED_GROUPS:
                self._cache.popitem(last=False)
        self._cache.move_to_end(key)
        return table


class TableCarryOver(CarryOver):
    """Carries rows over from an output synced in place, `rows` (found by their offset),
    in the run's process."""

    def __init__(self, lookup: PreviousLookup, rows: OutputRows) -> None:
        super().__init__(lookup, keeps_unread=True)
        self._rows = rows

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError("a synced table's rows are carried over in the run's process only")

    def sharing(self, lookup: PreviousLookup) -> CarryOver:
        raise TypeError("a synced table's rows are carried over in the run's process only")

    def _source(self, chunk: Chunk, entries: np.ndarray, same: np.ndarray) -> PreviousRows | None:
        return None

    def embeddings(self, entries: np.ndarray) -> pa.Table:
        assert self.lookup is not None
        columns = [c for c in EMBEDDING_COLUMNS if c in self._rows.names]
        return self._rows.take(self.lookup.rows[entries].tolist(), columns)


def _runs(values: np.ndarray) -> list[tuple[int, int]]:
    """(start, end) of each run of equal neighbours in `values`.

    >>> _runs(np.array([4, 4, 1, 4]))
    [(0, 2), (2, 3), (3, 4)]
    """
    if not len(values):
        return []
    edges = [0, *(np.flatnonzero(np.diff(values)) + 1).tolist(), len(values)]
    return list(zip(edges[:-1], edges[1:], strict=True))

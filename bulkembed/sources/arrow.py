"""Arrow IPC inputs (files or streams, as `datasets` writes them): one unit per
`records_per_unit` rows, read one batch at a time, memory-mapped. Other formats read as a
stream of record batches subclass it (`batches`)."""

from __future__ import annotations

from collections.abc import Container, Iterable, Iterator
from typing import ClassVar

import pyarrow as pa

from bulkembed.contracts import part_name
from bulkembed.sources.base import ReadSettings, TabularFormat
from bulkembed.sources.opening import READ_ERRORS, open_arrow
from bulkembed.sources.records import BadRecord, Chunk, InputFile
from bulkembed.storage import stop_on_store_failure


class ArrowFormat(TabularFormat):
    """`.arrow` files."""

    name = "arrow"
    suffixes: ClassVar[tuple[str, ...]] = (".arrow",)

    def batches(self, file: InputFile) -> pa.RecordBatchReader:
        """The file's record batches, with its schema."""
        return open_arrow(file.path)

    def records(self, file: InputFile) -> int:
        return sum(batch.num_rows for batch in self.batches(file))

    def schema(self, file: InputFile) -> pa.Schema | None:
        try:
            return self.batches(file).schema
        except READ_ERRORS as e:
            stop_on_store_failure(file.path, e)
            return None

    def read(
        self, index: int, file: InputFile, settings: ReadSettings, skip: Container[str]
    ) -> Iterator[Chunk]:
        batches: Iterator[tuple[pa.RecordBatch, list[str]]] = (
            (batch, []) for batch in self.batches(file)
        )
        return self.read_batches(index, file, settings, skip, batches)

    def read_batches(
        self,
        index: int,
        file: InputFile,
        settings: ReadSettings,
        skip: Container[str],
        batches: Iterable[tuple[pa.RecordBatch, list[str]]],
    ) -> Iterator[Chunk]:
        """`read`, from the file's `batches`, each with the reasons of the rows the format
        left out of it (quarantined with the unit its first row is in, at that row)."""
        per_unit = settings.records_per_unit
        pending: Chunk | None = None
        read = 0
        bad: list[BadRecord] = []
        try:
            for first, rows, left_out in _pieces(batches, settings):
                unit = first // per_unit
                if pending is not None:
                    pending.last_in_unit = pending.unit != unit
                    yield pending
                    pending = None
                if part_name(index, unit) not in skip:
                    pending = self.chunk(index, unit, file, rows, first, settings)
                    source = str(file.path)
                    pending.bad.extend(BadRecord(source, why, row=first) for why in left_out)
                read = first + rows.num_rows
        except READ_ERRORS as e:
            stop_on_store_failure(file.path, e)
            reason = f"unreadable from row {read} on: {e}"
            bad.append(BadRecord(str(file.path), reason, row=read))
        # The unit where reading stopped: the last one read, or the next if that was full.
        unit = max(read - (not bad), 0) // per_unit
        if pending is not None and pending.unit != unit:
            pending.last_in_unit = True
            yield pending
            pending = None
        if pending is None and part_name(index, unit) not in skip and (bad or not read):
            pending = settings.empty_chunk(index, unit)
        if pending is not None:
            pending.last_in_unit = True
            pending.bad.extend(bad)
            yield pending


def _pieces(
    batches: Iterable[tuple[pa.RecordBatch, list[str]]], settings: ReadSettings
) -> Iterator[tuple[int, pa.RecordBatch, list[str]]]:
    """(first row, rows, reasons left out) of a file's `batches`: at most `chunk_size`
    rows, within one unit; a batch's reasons go with its first piece (an empty one, for a
    batch of no row)."""
    per_unit = settings.records_per_unit
    row = 0
    for batch, left_out in batches:
        if not batch.num_rows and left_out:
            yield row, batch, left_out
        start = 0
        texts = batch.column(settings.text_column)
        rows = settings.chunk_rows(texts.nbytes, batch.num_rows)
        while start < batch.num_rows:
            at = row + start
            unit_end = (at // per_unit + 1) * per_unit
            size = min(rows, unit_end - at, batch.num_rows - start)
            yield at, batch.slice(start, size), left_out if start == 0 else []
            start += size
        row += batch.num_rows

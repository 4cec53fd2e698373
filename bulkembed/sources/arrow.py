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
        per_unit = settings.records_per_unit
        pending: Chunk | None = None
        read = 0
        bad: list[BadRecord] = []
        try:
            for first, rows in _pieces(self.batches(file), settings):
                unit = first // per_unit
                if pending is not None:
                    pending.last_in_unit = pending.unit != unit
                    yield pending
                    pending = None
                if part_name(index, unit) not in skip:
                    pending = self.chunk(index, unit, file, rows, first, settings)
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
    batches: Iterable[pa.RecordBatch], settings: ReadSettings
) -> Iterator[tuple[int, pa.RecordBatch]]:
    """(first row, rows) of a file's `batches`: at most `chunk_size` rows, within one
    unit."""
    per_unit = settings.records_per_unit
    row = 0
    for batch in batches:
        start = 0
        texts = batch.column(settings.text_column)
        rows = settings.chunk_rows(texts.nbytes, batch.num_rows)
        while start < batch.num_rows:
            at = row + start
            unit_end = (at // per_unit + 1) * per_unit
            size = min(rows, unit_end - at, batch.num_rows - start)
            yield at, batch.slice(start, size)
            start += size
        row += batch.num_rows

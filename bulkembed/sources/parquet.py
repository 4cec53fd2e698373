"""Parquet inputs: one unit per row group, read one batch of a row group at a time. On
object storage the footer and the column chunks read are fetched with ranged requests,
never the whole file. A row group whose text column is giant (`parquet_pages.GIANT`) has
that column read a page at a time, its long texts cut where they lie."""

from __future__ import annotations

from collections.abc import Container, Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from bulkembed.contracts import part_name
from bulkembed.sources.base import ReadSettings, TabularFormat
from bulkembed.sources.long_texts import TextCut
from bulkembed.sources.opening import READ_ERRORS
from bulkembed.sources.parquet_pages import GIANT, Unreadable, read_texts
from bulkembed.sources.records import BadRecord, Chunk, InputFile
from bulkembed.storage import random_access, stop_on_store_failure

# The content hashes of a giant row group's cut texts, a column of its batches.
_HASHES = "bulkembed content hash"


class ParquetFormat(TabularFormat):
    """`.parquet` files."""

    name = "parquet"
    suffixes = (".parquet",)

    def records(self, file: InputFile) -> int:
        return int(_footer(file).num_rows)

    def units(self, file: InputFile, records_per_unit: int) -> int:
        return int(_footer(file).num_row_groups)

    def schema(self, file: InputFile) -> pa.Schema | None:
        try:
            metadata = _footer(file)
        except READ_ERRORS as e:
            stop_on_store_failure(file.path, e)
            return None
        return metadata.schema.to_arrow_schema() if metadata.num_rows else None

    def read(
        self, index: int, file: InputFile, settings: ReadSettings, skip: Container[str]
    ) -> Iterator[Chunk]:
        with random_access(file.path) as source:
            yield from self._read(index, file, source, settings, skip)

    def _read(
        self,
        index: int,
        file: InputFile,
        source: Any,
        settings: ReadSettings,
        skip: Container[str],
    ) -> Iterator[Chunk]:
        import pyarrow.parquet as pq

        try:
            parquet = pq.ParquetFile(source)
        except READ_ERRORS as e:
            stop_on_store_failure(file.path, e)
            if part_name(index, 0) not in skip:
                bad = BadRecord(str(file.path), f"unreadable Parquet file: {e}")
                yield settings.empty_chunk(index, 0, [bad])
            return
        id_column = settings.id_column
        columns = [settings.text_column] + ([id_column] if id_column else [])
        columns += [c for c in settings.keep_columns if c not in columns]
        if parquet.num_row_groups == 0 and part_name(index, 0) not in skip:
            yield settings.empty_chunk(index, 0)
        first_row = 0
        for group in range(parquet.num_row_groups):
            if part_name(index, group) not in skip:
                yield from self._row_group(
                    index, group, file, (source, parquet), columns, first_row, settings
                )
            first_row += parquet.metadata.row_group(group).num_rows

    def _row_group(
        self,
        index: int,
        group: int,
        file: InputFile,
        opened: tuple[Any, Any],
        columns: list[str],
        first_row: int,
        settings: ReadSettings,
    ) -> Iterator[Chunk]:
        """The chunks of row group `group` of the file (`opened`: where pyarrow reads it
        from, and the `ParquetFile`)."""
        source, parquet = opened
        pending: Chunk | None = None
        row = first_row
        bad: list[BadRecord] = []
        try:
            metadata = parquet.metadata.row_group(group)
            text_bytes = _column_bytes(metadata, columns[0])
            size = settings.chunk_rows(text_bytes, metadata.num_rows)
            batches = parquet.iter_batches(batch_size=size, row_groups=[group], columns=columns)
            if settings.text_cut is not None and text_bytes > GIANT:
                giant = (source, parquet, group)
                batches = _giant_batches(giant, columns, size, settings.text_cut, batches)
            for batch in batches:
                if pending is not None:
                    yield pending
                pending = self.chunk(index, group, file, batch, row, settings)
                if _HASHES in batch.schema.names:
                    hashes = batch.column(_HASHES)
                    data = np.frombuffer(hashes.buffers()[1], "S16", len(hashes), hashes.offset)
                    pending.hashes = data[pending.positions - row]
                row += batch.num_rows
        except READ_ERRORS as e:
            stop_on_store_failure(file.path, e)
            reason = f"row group {group} unreadable from row {row} on: {e}"
            bad.append(BadRecord(str(file.path), reason, row=row))
        if pending is None:
            pending = settings.empty_chunk(index, group)
        pending.last_in_unit = True
        pending.bad.extend(bad)
        yield pending


def _giant_batches(
    giant: tuple[Any, Any, int], columns: list[str], size: int, cut: TextCut, read: Iterator[Any]
) -> Iterator[pa.RecordBatch]:
    """The batches of a row group whose text column (`columns[0]`) is giant (`giant`: the
    file's source, its `ParquetFile`, the row group): that column read a page at a time,
    its long texts cut where they lie (`parquet_pages`), with their content hashes as the
    column `_HASHES`; the rest by pyarrow. Where the pages are laid out otherwise, the
    batches pyarrow reads (`read`)."""
    source, parquet, group = giant
    number = parquet.schema_arrow.get_field_index(columns[0])
    column = parquet.metadata.row_group(group).column(number)
    definition = parquet.schema.column(number).max_definition_level
    try:
        if isinstance(source, str):
            with pa.OSFile(source) as opened:
                found = read_texts(opened, column, definition, cut)
        else:
            found = read_texts(source, column, definition, cut)
    except Unreadable:
        yield from read
        return
    others = parquet.read_row_group(group, columns=columns[1:]) if columns[1:] else None
    table = pa.table({columns[0]: pa.array(found.texts, pa.string())})
    for name in columns[1:]:
        assert others is not None
        table = table.append_column(name, others.column(name))
    hashes = pa.py_buffer(found.hashes.tobytes())
    column = pa.FixedSizeBinaryArray.from_buffers(pa.binary(16), len(found.hashes), [None, hashes])
    table = table.append_column(_HASHES, column)
    yield from table.to_batches(max_chunksize=size)


def _column_bytes(row_group: Any, name: str) -> int:
    """The bytes of column `name` in a row group's metadata, uncompressed."""
    for number in range(row_group.num_columns):
        column = row_group.column(number)
        if column.path_in_schema == name:
            return int(column.total_uncompressed_size)
    return 0


def _footer(file: InputFile) -> Any:
    """The file's metadata: rows, row groups, schema (only the footer is read)."""
    import pyarrow.parquet as pq

    with random_access(file.path) as source:
        return pq.read_metadata(source)

"""Parquet inputs: one unit per row group, read one batch of a row group at a time. On
object storage the footer and the column chunks read are fetched with ranged requests,
never the whole file."""

from __future__ import annotations

from collections.abc import Container, Iterator
from typing import Any

import pyarrow as pa

from bulkembed.contracts import part_name
from bulkembed.sources.base import ReadSettings, TabularFormat
from bulkembed.sources.opening import READ_ERRORS
from bulkembed.sources.records import BadRecord, Chunk, InputFile
from bulkembed.storage import random_access, stop_on_store_failure


class ParquetFormat(TabularFormat):
    """`.parquet` files."""

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
                    index, group, file, parquet, columns, first_row, settings
                )
            first_row += parquet.metadata.row_group(group).num_rows

    def _row_group(
        self,
        index: int,
        group: int,
        file: InputFile,
        parquet: Any,
        columns: list[str],
        first_row: int,
        settings: ReadSettings,
    ) -> Iterator[Chunk]:
        pending: Chunk | None = None
        row = first_row
        bad: list[BadRecord] = []
        try:
            metadata = parquet.metadata.row_group(group)
            size = settings.chunk_rows(_column_bytes(metadata, columns[0]), metadata.num_rows)
            batches = parquet.iter_batches(batch_size=size, row_groups=[group], columns=columns)
            for batch in batches:
                if pending is not None:
                    yield pending
                pending = self.chunk(index, group, file, batch, row, settings)
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

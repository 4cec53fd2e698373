"""Stream records from Parquet and JSONL shards in chunks, unit after unit.

Nothing here holds more than one chunk of a file in memory: Parquet is read one batch of a
row group at a time, JSONL one line at a time. Records that cannot be embedded travel in
`Chunk.bad`; a file that cannot be read, or stops being readable, becomes one bad record and
the other shards go on.
"""

from __future__ import annotations

import json
from collections.abc import Container, Iterator
from typing import Any

import pyarrow as pa

from bulkembed.errors import InputError
from bulkembed.sources.files import DEFAULT_LINES_PER_UNIT, READ_ERRORS, open_lines
from bulkembed.sources.records import BadRecord, Chunk, Rows, Shard, part_name

DEFAULT_ID_COLUMN = "id"
DEFAULT_CHUNK_SIZE = 512


def _is_text_type(kind: pa.DataType) -> bool:
    """String columns in any Arrow layout; an all-null column reads as type null."""
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_string_view(kind)
        or pa.types.is_null(kind)
    )


def _is_int64_compatible(kind: pa.DataType) -> bool:
    return pa.types.is_signed_integer(kind) or kind in (pa.uint8(), pa.uint16(), pa.uint32())


class RecordReader:
    """Chunks of every shard in order, skipping the units named in `done` (part names).

    `check()` reads every shard's columns (a Parquet footer, a JSONL file's first record)
    before any record is read, so a wrong column name fails at once, and fixes the type of
    the `id` column for the whole run: int64 when every shard is Parquet with an integer id
    column, else string (integer ids then written in decimal)."""

    def __init__(
        self,
        shards: list[Shard],
        text_column: str = "text",
        id_column: str | None = None,
        done: Container[str] = (),
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        lines_per_unit: int = DEFAULT_LINES_PER_UNIT,
    ) -> None:
        self.shards = shards
        self.text_column = text_column
        self.id_column = id_column
        self.done = done
        self.chunk_size = chunk_size
        self.lines_per_unit = lines_per_unit
        self._id_columns: dict[int, str | None] = {}
        self.id_type: pa.DataType | None = None

    def check(self) -> pa.DataType:
        """Check every shard's text and id columns; return the run's id type."""
        integer_ids = True
        for index, shard in enumerate(self.shards):
            if shard.format == "parquet":
                schema = self._parquet_schema(shard)
                if schema is None:
                    continue
                id_column = self._check_columns(schema.names, str(shard.path))
                text_type = schema.field(self.text_column).type
                if not _is_text_type(text_type):
                    raise InputError(
                        f"text column '{self.text_column}' in {shard.path} holds {text_type}, "
                        "not strings"
                    )
                id_type = schema.field(id_column).type if id_column else None
                integer_ids &= id_type is not None and _is_int64_compatible(id_type)
            else:
                record, line = self._first_record(shard)
                integer_ids = False
                if record is None:
                    id_column = None
                else:
                    id_column = self._check_columns(list(record), f"{shard.path} line {line}")
            self._id_columns[index] = id_column
        self.id_type = pa.int64() if integer_ids and self.shards else pa.string()
        return self.id_type

    def __iter__(self) -> Iterator[Chunk]:
        if self.id_type is None:
            self.check()
        for index, shard in enumerate(self.shards):
            reader = self._parquet if shard.format == "parquet" else self._jsonl
            yield from reader(index, shard)

    def _check_columns(self, columns: list[str], source: str) -> str | None:
        """The id column to use (None: ids from the shard name); an error if one is missing."""
        if self.text_column not in columns:
            raise InputError(
                f"text column '{self.text_column}' not found in {source}; "
                f"columns: {', '.join(columns) or 'none'} (choose one with --text-column)"
            )
        if self.id_column is None:
            return DEFAULT_ID_COLUMN if DEFAULT_ID_COLUMN in columns else None
        if self.id_column not in columns:
            raise InputError(
                f"id column '{self.id_column}' not found in {source}; "
                f"columns: {', '.join(columns) or 'none'} (choose one with --id-column)"
            )
        return self.id_column

    @staticmethod
    def _parquet_schema(shard: Shard) -> pa.Schema | None:
        """The schema of a Parquet shard with rows; None for an empty or unreadable one."""
        import pyarrow.parquet as pq

        try:
            metadata = pq.read_metadata(shard.path)
        except READ_ERRORS:
            return None
        return metadata.schema.to_arrow_schema() if metadata.num_rows else None

    @staticmethod
    def _first_record(shard: Shard) -> tuple[dict[str, Any] | None, int]:
        """The first line of a JSONL shard that holds a JSON object, and its line number."""
        try:
            with open_lines(shard.path) as lines:
                for number, raw in enumerate(lines, start=1):
                    record, _ = _parse_json_line(raw) if raw.strip() else (None, None)
                    if record is not None:
                        return record, number
        except READ_ERRORS:
            pass
        return None, 0

    def _empty_chunk(self, index: int, unit: int, bad: list[BadRecord] | None = None) -> Chunk:
        assert self.id_type is not None
        return Chunk(index, unit, pa.array([], self.id_type), [], True, bad or [])

    # Parquet: one unit per row group.

    def _parquet(self, index: int, shard: Shard) -> Iterator[Chunk]:
        import pyarrow.parquet as pq

        try:
            parquet = pq.ParquetFile(shard.path)
        except READ_ERRORS as e:
            if part_name(index, 0) not in self.done:
                bad = BadRecord(str(shard.path), f"unreadable Parquet file: {e}")
                yield self._empty_chunk(index, 0, [bad])
            return
        id_column = self._id_columns.get(index)
        columns = [self.text_column] + ([id_column] if id_column else [])
        if parquet.num_row_groups == 0 and part_name(index, 0) not in self.done:
            yield self._empty_chunk(index, 0)
        first_row = 0
        for group in range(parquet.num_row_groups):
            if part_name(index, group) not in self.done:
                yield from self._row_group(index, group, shard, parquet, columns, first_row)
            first_row += parquet.metadata.row_group(group).num_rows

    def _row_group(
        self,
        index: int,
        group: int,
        shard: Shard,
        parquet: Any,
        columns: list[str],
        first_row: int,
    ) -> Iterator[Chunk]:
        pending: Chunk | None = None
        row = first_row
        bad: list[BadRecord] = []
        try:
            batches = parquet.iter_batches(
                batch_size=self.chunk_size, row_groups=[group], columns=columns
            )
            for batch in batches:
                if pending is not None:
                    yield pending
                pending = self._parquet_chunk(index, group, shard, batch, row)
                row += batch.num_rows
        except READ_ERRORS as e:
            reason = f"row group {group} unreadable from row {row} on: {e}"
            bad.append(BadRecord(str(shard.path), reason, row=row))
        if pending is None:
            pending = self._empty_chunk(index, group)
        pending.last_in_unit = True
        pending.bad.extend(bad)
        yield pending

    def _parquet_chunk(
        self, index: int, group: int, shard: Shard, batch: pa.RecordBatch, first_row: int
    ) -> Chunk:
        assert self.id_type is not None
        texts = batch.column(self.text_column).to_pylist()
        id_column = self._id_columns.get(index)
        if id_column is None:
            ids: list[Any] = [f"{shard.name}:{first_row + i}" for i in range(len(texts))]
        else:
            ids = batch.column(id_column).to_pylist()
        rows = Rows()
        source = str(shard.path)
        for offset, (doc_id, text) in enumerate(zip(ids, texts, strict=True)):
            row = first_row + offset
            if text is None:
                rows.bad.append(BadRecord(source, "text is null", doc_id, row))
            elif doc_id is None:
                rows.bad.append(BadRecord(source, "id is null", row=row))
            elif not isinstance(doc_id, (str, int)) or isinstance(doc_id, bool):
                reason = f"id is of type {type(doc_id).__name__}, not a string or an integer"
                rows.bad.append(BadRecord(source, reason, doc_id, row))
            else:
                rows.add(doc_id, text, row)
        return rows.chunk(index, group, False, self.id_type)

    # JSONL: one unit per `lines_per_unit` lines.

    def _jsonl(self, index: int, shard: Shard) -> Iterator[Chunk]:
        assert self.id_type is not None
        id_type = self.id_type
        id_column = self._id_columns.get(index)
        rows = Rows()
        unit = 0
        lines_read = 0
        source = str(shard.path)
        try:
            with open_lines(shard.path) as lines:
                for line_number, raw in enumerate(lines):
                    lines_read = line_number + 1
                    if line_number // self.lines_per_unit != unit:
                        if part_name(index, unit) not in self.done:
                            yield rows.chunk(index, unit, True, id_type)
                        rows = Rows()
                        unit = line_number // self.lines_per_unit
                    elif len(rows) >= self.chunk_size:
                        yield rows.chunk(index, unit, False, id_type)
                        rows = Rows()
                    if part_name(index, unit) in self.done or not raw.strip():
                        continue
                    record, reason = _parse_json_line(raw)
                    if record is not None:
                        reason = self._take_record(record, shard, line_number, id_column, rows)
                    if reason is not None:
                        doc_id = record.get(id_column) if record and id_column else None
                        rows.bad.append(BadRecord(source, reason, doc_id, line=line_number + 1))
        except READ_ERRORS as e:
            reason = f"unreadable after line {lines_read}: {e or type(e).__name__}"
            rows.bad.append(BadRecord(source, reason, line=lines_read + 1))
        if part_name(index, unit) not in self.done:
            yield rows.chunk(index, unit, True, id_type)

    def _take_record(
        self,
        record: dict[str, Any],
        shard: Shard,
        line_number: int,
        id_column: str | None,
        rows: Rows,
    ) -> str | None:
        """Add a parsed record to `rows`, or return why it cannot be embedded."""
        if self.text_column not in record:
            return f"no '{self.text_column}' field"
        text = record[self.text_column]
        if text is None:
            return "text is null"
        if not isinstance(text, str):
            return f"text is of type {type(text).__name__}, not a string"
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            return f"text holds an unpaired surrogate at character {e.start}, not valid Unicode"
        if id_column is None:
            doc_id: Any = f"{shard.name}:{line_number}"
        else:
            doc_id = record.get(id_column)
            if doc_id is None:
                return f"no '{id_column}' field" if id_column not in record else "id is null"
            if not isinstance(doc_id, (str, int)) or isinstance(doc_id, bool):
                return f"id is of type {type(doc_id).__name__}, not a string or an integer"
        rows.add(doc_id, text, line_number)
        return None


def _parse_json_line(raw: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """The JSON object on one line, or None and the reason it is not one."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return None, f"invalid UTF-8 at byte {e.start}"
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        return None, f"malformed JSON: {e.msg} at column {e.colno}"
    if not isinstance(record, dict):
        return None, f"a JSON {type(record).__name__}, not an object"
    return record, None

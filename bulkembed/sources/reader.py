"""Stream records from Parquet and JSONL shards in chunks, unit after unit.

Nothing here holds more than one chunk of a file in memory: Parquet is read one batch of a
row group at a time, JSONL one line at a time. Records that cannot be embedded travel in
`Chunk.bad`; a file that cannot be read, or stops being readable, becomes one bad record and
the other shards go on.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Container, Iterable, Iterator
from typing import Any

import pyarrow as pa

from bulkembed.config import DEFAULT_RECORDS_PER_UNIT
from bulkembed.contracts import part_name
from bulkembed.errors import InputError
from bulkembed.sources.files import READ_ERRORS, open_arrow, open_lines
from bulkembed.sources.hf import dataset_records
from bulkembed.sources.records import BadRecord, Chunk, Rows, Shard

DEFAULT_ID_COLUMN = "id"
DEFAULT_CHUNK_SIZE = 512
BYTE_ORDER_MARK = "\ufeff"
# JSON lines read to infer the Arrow type of a passthrough column.
TYPE_SAMPLE_LINES = 100


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


def _is_binary_type(kind: pa.DataType) -> bool:
    """Bytes columns, which Spark and older writers use for strings: decoded as UTF-8."""
    return pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or kind == pa.binary_view()


def _is_int64_compatible(kind: pa.DataType) -> bool:
    return pa.types.is_signed_integer(kind) or kind in (pa.uint8(), pa.uint16(), pa.uint32())


class RecordReader:
    """Chunks of every shard in order, skipping the units named in `done` (part names).

    `check()` reads every shard's columns (a Parquet footer, a JSONL file's first record)
    before any record is read, so a wrong column name fails at once, and fixes the type of
    the `id` column for the whole run: int64 when every shard is Parquet with an integer id
    column, else string (integer ids then written in decimal).

    `keep_columns` are passed through with every record. Their types (`column_types`) come
    from the first shard that has them: a Parquet schema, or the first JSON lines' values."""

    def __init__(
        self,
        shards: list[Shard],
        text_column: str = "text",
        id_column: str | None = None,
        done: Container[str] = (),
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        lines_per_unit: int = DEFAULT_RECORDS_PER_UNIT,
        keep_columns: tuple[str, ...] = (),
    ) -> None:
        self.shards = shards
        self.text_column = text_column
        self.id_column = id_column
        self.done = done
        self.chunk_size = chunk_size
        self.lines_per_unit = lines_per_unit
        self.keep_columns = keep_columns
        self._id_columns: dict[int, str | None] = {}
        self.id_type: pa.DataType | None = None
        self.column_types: dict[str, pa.DataType] = {}

    def check(self) -> pa.DataType:
        """Check every shard's text and id columns; return the run's id type."""
        integer_ids = True
        for index, shard in enumerate(self.shards):
            if shard.format in ("parquet", "arrow"):
                schema = self._arrow_schema(shard)
                if schema is None:
                    continue
                id_column = self._check_columns(schema.names, str(shard.path))
                text_type = schema.field(self.text_column).type
                if not _is_text_type(text_type) and not _is_binary_type(text_type):
                    raise InputError(
                        f"text column '{self.text_column}' in {shard.path} holds {text_type}, "
                        "not strings"
                    )
                id_type = schema.field(id_column).type if id_column else None
                integer_ids &= id_type is not None and _is_int64_compatible(id_type)
                for name in self.keep_columns:
                    self._set_column_type(name, _passthrough_type(schema, name, shard))
            else:
                records, line = self._first_records(shard)
                integer_ids = False
                if not records:
                    id_column = None
                else:
                    # A JSON file's columns: the fields of its first records, all of them.
                    fields = list(dict.fromkeys(key for record in records for key in record))
                    id_column = self._check_columns(fields, f"{shard.path} from line {line}")
                for name in self.keep_columns:
                    values = [r.get(name) for r in records if r.get(name) is not None]
                    if values and name not in self.column_types:
                        self._set_column_type(name, _json_type(values, name, shard))
            self._id_columns[index] = id_column
        for name in self.keep_columns:
            if name not in self.column_types:
                self._set_column_type(name, self._scan_json_type(name))
            if pa.types.is_null(self.column_types[name]):
                self.column_types[name] = pa.string()
        self.id_type = pa.int64() if integer_ids and self.shards else pa.string()
        return self.id_type

    def __iter__(self) -> Iterator[Chunk]:
        if self.id_type is None:
            self.check()
        for index in range(len(self.shards)):
            yield from self.read_shard(index)

    def read_unit(self, index: int, unit: int, offset: int | None) -> Iterator[Chunk]:
        """The chunks of the shard at `index`, from unit `unit` on, skipping units in
        `done`. An uncompressed JSONL shard is read from byte `offset` (where the unit
        starts, from `unit_offsets`), other shards from their start."""
        shard = self.shards[index]
        if shard.format != "jsonl" or offset is None or shard.path.name.lower().endswith(".gz"):
            yield from self.read_shard(index)
            return
        if self.id_type is None:
            self.check()

        def lines() -> Iterator[bytes]:
            with open(shard.path, "rb") as f:
                f.seek(offset)
                yield from f

        first = unit * self.lines_per_unit
        yield from self._record_units(
            index, shard, lines(), _parse_json_line, READ_ERRORS, first=first
        )

    def read_shard(self, index: int) -> Iterator[Chunk]:
        """The chunks of the shard at `index` alone, skipping its units in `done`."""
        if self.id_type is None:
            self.check()
        readers = {"parquet": self._parquet, "arrow": self._arrow, "hf": self._dataset}
        shard = self.shards[index]
        yield from readers.get(shard.format, self._jsonl)(index, shard)

    def _scan_json_type(self, name: str) -> pa.DataType:
        """The type of a JSON field that the first lines of every file lack: from its first
        values further on. A field in no record at all is an error (a misspelt name)."""
        values: list[Any] = []
        for shard in self.shards:
            if shard.format != "jsonl":
                continue
            try:
                with open_lines(shard.path) as lines:
                    for raw in lines:
                        record, _ = _parse_json_line(raw) if raw.strip() else (None, None)
                        if record is not None and record.get(name) is not None:
                            values.append(record[name])
                            if len(values) == TYPE_SAMPLE_LINES:
                                return _json_type(values, name, shard)
            except READ_ERRORS:
                continue
            if values:
                return _json_type(values, name, shard)
        if any(shard.format == "hf" for shard in self.shards):
            return pa.string()
        raise InputError(
            f"--keep-columns '{name}' has a value in no record of the inputs: check the name"
        )

    def _set_column_type(self, name: str, kind: pa.DataType) -> None:
        """A passthrough column's type over every shard: the same type, or the one that
        holds both (int64 for integers, float64 for numbers, string for strings)."""
        first = self.column_types.setdefault(name, kind)
        unified = _unify(first, kind)
        if unified is None:
            raise InputError(
                f"--keep-columns '{name}' is {first} in one input and {kind} in another: "
                "make the inputs agree"
            )
        self.column_types[name] = unified

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
    def _arrow_schema(shard: Shard) -> pa.Schema | None:
        """The schema of a Parquet or Arrow shard; None for an unreadable one or a Parquet
        file without rows."""
        import pyarrow.parquet as pq

        try:
            if shard.format == "arrow":
                return open_arrow(shard.path).schema
            metadata = pq.read_metadata(shard.path)
        except READ_ERRORS:
            return None
        return metadata.schema.to_arrow_schema() if metadata.num_rows else None

    @staticmethod
    def _first_records(shard: Shard) -> tuple[list[dict[str, Any]], int]:
        """The JSON objects among the first lines of a JSONL shard (or the first records of
        a dataset shard), and the line number of the first of them."""
        if shard.format == "hf":
            return list(itertools.islice(dataset_records(shard), TYPE_SAMPLE_LINES)), 1
        records: list[dict[str, Any]] = []
        first = 0
        try:
            with open_lines(shard.path) as lines:
                for number, raw in enumerate(lines, start=1):
                    if number > TYPE_SAMPLE_LINES and records:
                        break
                    record, _ = _parse_json_line(raw) if raw.strip() else (None, None)
                    if record is not None:
                        records.append(record)
                        first = first or number
        except READ_ERRORS:
            pass
        return records, first

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
        columns += [c for c in self.keep_columns if c not in columns]
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
                pending = self._arrow_chunk(index, group, shard, batch, row)
                row += batch.num_rows
        except READ_ERRORS as e:
            reason = f"row group {group} unreadable from row {row} on: {e}"
            bad.append(BadRecord(str(shard.path), reason, row=row))
        if pending is None:
            pending = self._empty_chunk(index, group)
        pending.last_in_unit = True
        pending.bad.extend(bad)
        yield pending

    def _arrow_chunk(
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
            doc_id, id_reason = _decoded(doc_id, "id")
            text, text_reason = _decoded(text, "text")
            if id_reason or text_reason:
                rows.bad.append(BadRecord(source, id_reason or text_reason, doc_id, row))
            elif text is None:
                rows.bad.append(BadRecord(source, "text is null", doc_id, row))
            elif doc_id is None:
                rows.bad.append(BadRecord(source, "id is null", row=row))
            elif not isinstance(doc_id, (str, int)) or isinstance(doc_id, bool):
                reason = f"id is of type {type(doc_id).__name__}, not a string or an integer"
                rows.bad.append(BadRecord(source, reason, doc_id, row))
            else:
                rows.add(doc_id, text, row)
        offsets = pa.array([p - first_row for p in rows.positions], pa.int64())
        values = {name: batch.column(name).take(offsets) for name in self.column_types}
        misfits: dict[int, str] = {}
        for name, kind in self.column_types.items():
            misfits = {**_cast_misfits(name, values[name], kind), **misfits}
        if misfits:
            for (doc_id, row), i in zip(rows.drop(set(misfits)), sorted(misfits), strict=True):
                rows.bad.append(BadRecord(source, misfits[i], doc_id, row))
            offsets = pa.array([p - first_row for p in rows.positions], pa.int64())
            values = {name: batch.column(name).take(offsets) for name in self.column_types}
        columns = {name: values[name].cast(kind) for name, kind in self.column_types.items()}
        return rows.chunk(index, group, False, self.id_type, columns)

    # Arrow IPC: one unit per `lines_per_unit` rows.

    def _arrow(self, index: int, shard: Shard) -> Iterator[Chunk]:
        pending: Chunk | None = None
        read = 0
        bad: list[BadRecord] = []
        try:
            for first, rows in self._arrow_pieces(shard):
                unit = first // self.lines_per_unit
                if pending is not None:
                    pending.last_in_unit = pending.unit != unit
                    yield pending
                    pending = None
                if part_name(index, unit) not in self.done:
                    pending = self._arrow_chunk(index, unit, shard, rows, first)
                read = first + rows.num_rows
        except READ_ERRORS as e:
            reason = f"unreadable from row {read} on: {e}"
            bad.append(BadRecord(str(shard.path), reason, row=read))
        # The unit where reading stopped: the last one read, or the next if that was full.
        unit = max(read - (not bad), 0) // self.lines_per_unit
        if pending is not None and pending.unit != unit:
            pending.last_in_unit = True
            yield pending
            pending = None
        if pending is None and part_name(index, unit) not in self.done and (bad or not read):
            pending = self._empty_chunk(index, unit)
        if pending is not None:
            pending.last_in_unit = True
            pending.bad.extend(bad)
            yield pending

    def _arrow_pieces(self, shard: Shard) -> Iterator[tuple[int, pa.RecordBatch]]:
        """(first row, rows) of an Arrow file: at most `chunk_size` rows, within one unit."""
        row = 0
        for batch in open_arrow(shard.path):
            start = 0
            while start < batch.num_rows:
                at = row + start
                unit_end = (at // self.lines_per_unit + 1) * self.lines_per_unit
                size = min(self.chunk_size, unit_end - at, batch.num_rows - start)
                yield at, batch.slice(start, size)
                start += size
            row += batch.num_rows

    # JSON lines and dataset records: one unit per `lines_per_unit` of them.

    def _jsonl(self, index: int, shard: Shard) -> Iterator[Chunk]:
        def lines() -> Iterator[bytes]:
            with open_lines(shard.path) as f:
                yield from f

        yield from self._record_units(index, shard, lines(), _parse_json_line, READ_ERRORS)

    def _dataset(self, index: int, shard: Shard) -> Iterator[Chunk]:
        try:
            yield from self._record_units(index, shard, dataset_records(shard), _as_record, ())
        except InputError:
            raise
        except Exception as e:  # a stream fails in many ways (network, server, decoding)
            raise InputError(
                f"reading {shard.name} failed: {e}; run the same command again to resume"
            ) from e

    def _record_units(
        self,
        index: int,
        shard: Shard,
        items: Iterable[Any],
        parse: Callable[[Any], tuple[dict[str, Any] | None, str | None]],
        read_errors: tuple[type[BaseException], ...],
        first: int = 0,
    ) -> Iterator[Chunk]:
        """Chunks of records parsed from `items` (lines, or dataset records; the first is
        number `first`), unit by unit. Records of done units are skipped unparsed; blank
        lines are no record. A read error in `read_errors` sets the rest of the shard
        aside."""
        id_column = self._id_columns.get(index)
        rows = Rows()
        unit = first // self.lines_per_unit
        read = first
        lines = shard.format != "hf"
        source = str(shard.path) if lines else shard.name
        try:
            for number, item in enumerate(items, start=first):
                read = number + 1
                if number // self.lines_per_unit != unit:
                    if part_name(index, unit) not in self.done:
                        yield self._json_chunk(rows, index, unit, True, source, lines)
                    rows = Rows()
                    unit = number // self.lines_per_unit
                elif len(rows) >= self.chunk_size:
                    yield self._json_chunk(rows, index, unit, False, source, lines)
                    rows = Rows()
                if part_name(index, unit) in self.done or (lines and not item.strip()):
                    continue
                record, reason = parse(item)
                if record is not None:
                    reason = self._take_record(record, shard, number, id_column, rows)
                if reason is not None:
                    doc_id = record.get(id_column) if record and id_column else None
                    rows.bad.append(_bad_record(source, reason, doc_id, number, lines))
        except read_errors as e:
            reason = f"unreadable after line {read}: {e or type(e).__name__}"
            rows.bad.append(BadRecord(source, reason, line=read + 1))
        if part_name(index, unit) not in self.done:
            yield self._json_chunk(rows, index, unit, True, source, lines)

    def _json_chunk(
        self, rows: Rows, index: int, unit: int, last: bool, source: str, lines: bool
    ) -> Chunk:
        """A chunk of records read as Python objects, their passthrough values made Arrow
        columns; a record whose value does not fit its column's type is set aside."""
        assert self.id_type is not None
        misfits: dict[int, str] = {}
        for name, kind in self.column_types.items():
            for i, value in enumerate(rows.values.get(name, [])):
                reason = None if i in misfits else _misfit(name, value, kind)
                if reason is not None:
                    misfits[i] = reason
        for (doc_id, position), i in zip(rows.drop(set(misfits)), sorted(misfits), strict=True):
            rows.bad.append(_bad_record(source, misfits[i], doc_id, position, lines))
        columns = {
            name: pa.array(rows.values.get(name, []), kind)
            for name, kind in self.column_types.items()
        }
        return rows.chunk(index, unit, last, self.id_type, columns)

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
            if isinstance(doc_id, str) and not _encodable(doc_id):
                return "id holds an unpaired surrogate, not valid Unicode"
        rows.add(doc_id, text, line_number)
        for name in self.keep_columns:
            rows.values.setdefault(name, []).append(record.get(name))
        return None


def _bad_record(source: str, reason: str, doc_id: Any, position: int, lines: bool) -> BadRecord:
    """A bad record at a JSON line (numbered from 1) or a dataset record (from 0)."""
    if lines:
        return BadRecord(source, reason, doc_id, line=position + 1)
    return BadRecord(source, reason, doc_id, row=position)


def _decoded(value: Any, what: str) -> tuple[Any, str | None]:
    """A value of a bytes column as a string, or the reason it is not valid UTF-8."""
    if not isinstance(value, bytes):
        return value, None
    try:
        return value.decode("utf-8"), None
    except UnicodeDecodeError as e:
        return None, f"{what} is not valid UTF-8 (byte {e.start} of a binary column)"


def _as_record(item: Any) -> tuple[dict[str, Any] | None, str | None]:
    """A dataset record is a dict already."""
    return item, None


def _parse_json_line(raw: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """The JSON object on one line, or None and the reason it is not one. A UTF-8
    byte-order mark before it (Windows tools write one at the start of a file) is no part
    of it."""
    try:
        line = raw.decode("utf-8").removeprefix(BYTE_ORDER_MARK)
    except UnicodeDecodeError as e:
        return None, f"invalid UTF-8 at byte {e.start}"
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        # Some messages end in "at" already ("Invalid control character at").
        return None, f"malformed JSON: {e.msg.removesuffix(' at')} at column {e.colno}"
    except RecursionError:
        return None, "JSON nested too deeply to read"
    if not isinstance(record, dict):
        return None, f"a JSON {type(record).__name__}, not an object"
    return record, None


def _passthrough_type(schema: pa.Schema, name: str, shard: Shard) -> pa.DataType:
    if name not in schema.names:
        raise InputError(
            f"--keep-columns '{name}' not found in {shard.path}; columns: {', '.join(schema.names)}"
        )
    return schema.field(name).type


def _unify(first: pa.DataType, second: pa.DataType) -> pa.DataType | None:
    if first == second or pa.types.is_null(second):
        return first
    if pa.types.is_null(first):
        return second
    kinds = (first, second)
    if all(pa.types.is_integer(k) for k in kinds):
        return pa.int64()
    if all(pa.types.is_integer(k) or pa.types.is_floating(k) for k in kinds):
        return pa.float64()
    if all(_is_text_type(k) and not pa.types.is_null(k) for k in kinds):
        return pa.string()
    return None


def _json_type(values: list[Any], name: str, shard: Shard) -> pa.DataType:
    """The Arrow type of a JSON field's first non-null values (those that are valid
    Unicode: the others are bad records)."""
    try:
        return pa.array([v for v in values if _encodable(v)]).type
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        raise InputError(
            f"--keep-columns '{name}' mixes values of different types in the first "
            f"{TYPE_SAMPLE_LINES} lines of {shard.path}: make them agree"
        ) from None


def _cast_misfits(name: str, values: pa.Array, kind: pa.DataType) -> dict[int, str]:
    """The values of a passthrough column that do not cast to its type (an integer past
    2^53 into float64, say), by index, with the reason."""
    try:
        values.cast(kind)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    else:
        return {}
    misfits = {}
    for i in range(len(values)):
        try:
            values.slice(i, 1).cast(kind)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            value = values[i].as_py()
            misfits[i] = (
                f"--keep-columns '{name}' holds {value!r:.40}, which does not fit the "
                f"column's type {kind} (the type that holds every input's)"
            )
    return misfits


def _encodable(value: Any) -> bool:
    """Whether a JSON value's strings are all valid Unicode (no unpaired surrogate)."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _misfit(name: str, value: Any, kind: pa.DataType) -> str | None:
    """Why a passthrough value cannot go into its column, or None if it can."""
    if value is None:
        return None
    if not _encodable(value):
        return f"--keep-columns '{name}' holds text with an unpaired surrogate, not valid Unicode"
    try:
        pa.scalar(value, kind)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
        return (
            f"--keep-columns '{name}' holds {type(value).__name__} {value!r:.40}, "
            f"which does not fit the column's type {kind} (from the first records)"
        )
    return None

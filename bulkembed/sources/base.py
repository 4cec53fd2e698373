"""What every input format does: count its units, describe its columns, read its units.

A format reads with the choices the reader made over every input (`ReadSettings`: the
text column, the type of ids and passthrough columns, chunk and unit sizes) and skips the
units in the skip set it is given. Tabular formats (Parquet, Arrow) read record batches;
record formats (JSON lines, datasets) read one record at a time.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Container, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bulkembed.contracts import part_name
from bulkembed.sources.columns import cast_misfits, misfit
from bulkembed.sources.image_columns import IMAGE_TYPE, image_chunk, image_value
from bulkembed.sources.long_texts import TextCut
from bulkembed.sources.records import BadRecord, Chunk, InputFile, Rows
from bulkembed.sources.validate import bad_record, decoded, problem
from bulkembed.storage import stop_on_store_failure

# A chunk of short texts grows past `chunk_size` records until its texts hold about this
# many bytes (up to `short_chunk_size` records): the run's process then handles a few
# large arrays rather than many small ones.
CHUNK_TEXT_BYTES = 512 << 10


@dataclass(frozen=True, slots=True)
class ReadSettings:
    """How the reader reads every input: `id_column` is this file's (None: ids from the
    file's name and the record's position). A chunk holds `chunk_size` records, or more
    when they are short: up to `short_chunk_size`, about `CHUNK_TEXT_BYTES` of text."""

    text_column: str
    id_column: str | None
    keep_columns: tuple[str, ...]
    column_types: dict[str, pa.DataType]
    id_type: pa.DataType
    chunk_size: int
    records_per_unit: int
    short_chunk_size: int
    # How long texts are cut (None: not at all); a longer JSON line is read alone.
    text_cut: TextCut | None = None
    # Whether the records are images (`text_column` names their column: `sources.images`).
    images: bool = False

    def chunk_rows(self, text_bytes: int, records: int) -> int:
        """The records of a chunk, for texts that hold `text_bytes` over `records`.

        >>> settings = ReadSettings("text", None, (), {}, pa.string(), 512, 10**5, 4096)
        >>> [settings.chunk_rows(b, 1000) for b in (50_000, 300_000, 2_000_000)]
        [4096, 1747, 512]
        """
        fit = CHUNK_TEXT_BYTES * records // max(text_bytes, 1)
        return max(self.chunk_size, min(self.short_chunk_size, fit))

    def chunk_full(self, records: int, text_bytes: int) -> bool:
        """Whether a chunk of `records` whose texts hold `text_bytes` is full (`chunk_rows`)."""
        if records < self.chunk_size:
            return False
        return records >= self.short_chunk_size or text_bytes >= CHUNK_TEXT_BYTES

    def empty_chunk(self, index: int, unit: int, bad: list[BadRecord] | None = None) -> Chunk:
        return Chunk(
            index, unit, pa.array([], self.id_type), pa.array([], pa.string()), True, bad or []
        )


class InputFormat(ABC):
    """One kind of input file, by its `name`, read from files whose names end in one of
    its `suffixes` (none: found otherwise, as datasets are), which `title` names in errors
    where the suffixes do not say it (`registry`); found in an input directory, or only
    when named or matched by a glob (`in_folders` False). `tabular` formats have a schema
    (`schema`); the others are sampled by their first records (`sample`). A `streamed`
    format's units cannot be counted, nor its content digested, before it is read.
    `lines`: positions are line numbers. An `images` format's records are images (an image
    folder, WebDataset shards), read with no column named."""

    name: ClassVar[str]
    suffixes: ClassVar[tuple[str, ...]] = ()
    title: ClassVar[str] = ""
    in_folders: ClassVar[bool] = True
    tabular = False
    streamed = False
    lines = False
    images = False

    @abstractmethod
    def records(self, file: InputFile) -> int:
        """Records in the file, for progress and unit counts."""

    def units(self, file: InputFile, records_per_unit: int) -> int:
        """Units of work in the file."""
        return -(-self.records(file) // records_per_unit)

    def unit_offsets(self, file: InputFile, records_per_unit: int) -> list[int] | None:
        """Where each unit starts in the file, in bytes, where the format can seek there."""
        return None

    def schema(self, file: InputFile) -> pa.Schema | None:
        """The columns of a tabular file (None for an unreadable or empty one)."""
        return None

    def sample(self, file: InputFile) -> tuple[list[dict[str, Any]], int]:
        """The first records of the file, and the line number of the first of them."""
        return [], 0

    def values(self, file: InputFile, name: str) -> list[Any]:
        """Up to `TYPE_SAMPLE_LINES` values of field `name`, read further than `sample`."""
        return []

    @abstractmethod
    def read(
        self, index: int, file: InputFile, settings: ReadSettings, skip: Container[str]
    ) -> Iterator[Chunk]:
        """The chunks of the file at `index` of the inputs, unit by unit, but for `skip`."""

    def read_from(
        self,
        index: int,
        file: InputFile,
        settings: ReadSettings,
        skip: Container[str],
        unit: int,
        offset: int | None,
    ) -> Iterator[Chunk]:
        """`read`, where the format can, from unit `unit` at byte `offset`."""
        return self.read(index, file, settings, skip)


class TabularFormat(InputFormat):
    """A format of record batches with a schema."""

    tabular = True

    @staticmethod
    def chunk(
        index: int,
        unit: int,
        file: InputFile,
        batch: pa.RecordBatch,
        first_row: int,
        settings: ReadSettings,
    ) -> Chunk:
        """The records of `batch` (rows from `first_row` on), validated and typed: as Arrow
        arrays throughout when every record is valid, else record by record."""
        if settings.images:
            return image_chunk(index, unit, file, batch, first_row, settings)
        whole = all_valid(index, unit, file, batch, first_row, settings)
        if whole is not None:
            return whole
        texts = batch.column(settings.text_column).to_pylist()
        if settings.id_column is None:
            ids: list[Any] = [f"{file.name}:{first_row + i}" for i in range(len(texts))]
        else:
            ids = batch.column(settings.id_column).to_pylist()
        rows = Rows()
        source = str(file.path)
        for offset, (doc_id, text) in enumerate(zip(ids, texts, strict=True)):
            row = first_row + offset
            doc_id, id_reason = decoded(doc_id, "id")
            text, text_reason = decoded(text, "text")
            reason = id_reason or text_reason or problem(doc_id, text)
            if reason is not None:
                rows.bad.append(BadRecord(source, reason, doc_id, row))
            else:
                rows.add(doc_id, text, row)
        types = settings.column_types
        offsets = pa.array([p - first_row for p in rows.positions], pa.int64())
        values = {name: batch.column(name).take(offsets) for name in types}
        misfits: dict[int, str] = {}
        for name, kind in types.items():
            misfits = {**cast_misfits(name, values[name], kind), **misfits}
        if misfits:
            for (doc_id, row), i in zip(rows.drop(set(misfits)), sorted(misfits), strict=True):
                rows.bad.append(BadRecord(source, misfits[i], doc_id, row))
            offsets = pa.array([p - first_row for p in rows.positions], pa.int64())
            values = {name: batch.column(name).take(offsets) for name in types}
        columns = {name: values[name].cast(kind) for name, kind in types.items()}
        return rows.chunk(index, unit, False, settings.id_type, columns)


def all_valid(
    index: int,
    unit: int,
    file: InputFile,
    batch: pa.RecordBatch,
    first_row: int,
    settings: ReadSettings,
) -> Chunk | None:
    """The records of `batch` as a chunk, without a look at each, when every one is valid:
    texts of valid UTF-8 and no null, ids strings or integers and no null, passthrough
    values that fit their columns. None when one may not be (`TabularFormat.chunk` then
    tells which)."""
    texts = batch.column(settings.text_column)
    id_column = settings.id_column
    ids = None if id_column is None else batch.column(id_column)
    for values, integers in ((texts, False), (ids, True)):
        if values is None:
            continue
        kind = values.type
        textual = pa.types.is_string(kind) or pa.types.is_large_string(kind)
        if values.null_count or not (textual or (integers and pa.types.is_integer(kind))):
            return None
        try:
            values.validate(full=True)  # strings of valid UTF-8
        except pa.ArrowInvalid:
            return None
    positions = np.arange(first_row, first_row + batch.num_rows, dtype=np.int64)
    if ids is None:
        numbers = pa.array(positions).cast(pa.string())
        ids = pc.binary_join_element_wise(f"{file.name}:", numbers, "")
    elif pa.types.is_integer(settings.id_type) and not pa.types.is_integer(ids.type):
        return None
    try:
        ids = ids.cast(settings.id_type)
        columns = {
            name: batch.column(name).cast(kind) for name, kind in settings.column_types.items()
        }
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    return Chunk(index, unit, ids, texts.cast(pa.string()), False, [], positions, columns)


class RecordFormat(InputFormat):
    """A format of records read one at a time: `records_per_unit` of them make a unit."""

    def source(self, file: InputFile) -> str:
        """How bad records name the file."""
        return str(file.path)

    def units_of(
        self,
        index: int,
        file: InputFile,
        settings: ReadSettings,
        skip: Container[str],
        items: Iterable[Any],
        parse: Callable[[Any], tuple[dict[str, Any] | None, str | None]],
        read_errors: tuple[type[BaseException], ...],
        first: int = 0,
    ) -> Iterator[Chunk]:
        """Chunks of records parsed from `items` (lines, or dataset records; the first is
        number `first`), unit by unit. Records of skipped units are not parsed; blank
        lines are no record. A read error in `read_errors` sets the rest of the file
        aside."""
        per_unit = settings.records_per_unit
        rows = Rows()
        unit = first // per_unit
        read = first
        source = self.source(file)
        try:
            for number, item in enumerate(items, start=first):
                read = number + 1
                if number // per_unit != unit:
                    if part_name(index, unit) not in skip:
                        yield self._chunk(rows, index, unit, True, source, settings)
                    rows = Rows()
                    unit = number // per_unit
                elif settings.chunk_full(len(rows), rows.text_bytes):
                    yield self._chunk(rows, index, unit, False, source, settings)
                    rows = Rows()
                if part_name(index, unit) in skip or (self.lines and not item.strip()):
                    continue
                record, reason = parse(item)
                if record is not None:
                    reason = _take(record, file, number, settings, rows)
                if reason is not None:
                    column = settings.id_column
                    doc_id = record.get(column) if record and column else None
                    rows.bad.append(bad_record(source, reason, doc_id, number, self.lines))
        except read_errors as e:
            stop_on_store_failure(file.path, e)
            reason = f"unreadable after line {read}: {e or type(e).__name__}"
            rows.bad.append(BadRecord(source, reason, line=read + 1))
        if part_name(index, unit) not in skip:
            yield self._chunk(rows, index, unit, True, source, settings)

    def _chunk(
        self, rows: Rows, index: int, unit: int, last: bool, source: str, settings: ReadSettings
    ) -> Chunk:
        """A chunk of records read as Python objects, their passthrough values made Arrow
        columns; a record whose value does not fit its column's type is set aside."""
        misfits: dict[int, str] = {}
        for name, kind in settings.column_types.items():
            for i, value in enumerate(rows.values.get(name, [])):
                reason = None if i in misfits else misfit(name, value, kind)
                if reason is not None:
                    misfits[i] = reason
        for (doc_id, position), i in zip(rows.drop(set(misfits)), sorted(misfits), strict=True):
            rows.bad.append(bad_record(source, misfits[i], doc_id, position, self.lines))
        columns = {
            name: pa.array(rows.values.get(name, []), kind)
            for name, kind in settings.column_types.items()
        }
        contents = IMAGE_TYPE if settings.images else pa.string()
        return rows.chunk(index, unit, last, settings.id_type, columns, contents)


def _take(
    record: dict[str, Any], file: InputFile, number: int, settings: ReadSettings, rows: Rows
) -> str | None:
    """Add a parsed record to `rows`, or return why it cannot be embedded."""
    if settings.text_column not in record:
        return f"no '{settings.text_column}' field"
    column = settings.id_column
    doc_id = f"{file.name}:{number}" if column is None else record.get(column)
    content = record[settings.text_column]
    if settings.images:
        content, reason = image_value(content)
        reason = reason or problem(doc_id, "")
    else:
        reason = problem(doc_id, content)
    if reason == "id is null" and column is not None and column not in record:
        return f"no '{column}' field"
    if reason is not None:
        return reason
    rows.add(doc_id, content, number)
    for name in settings.keep_columns:
        rows.values.setdefault(name, []).append(record.get(name))
    return None

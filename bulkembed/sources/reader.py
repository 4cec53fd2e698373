"""Stream records from every input file in chunks, unit after unit.

Nothing here holds more than one chunk of a file in memory: each format reads a batch or a
line at a time. Records that cannot be embedded travel in `Chunk.bad`; a file that cannot
be read, or stops being readable, becomes one bad record and the other files go on.
"""

from __future__ import annotations

from collections.abc import Container, Iterator

import pyarrow as pa

from bulkembed.config import DEFAULT_RECORDS_PER_UNIT
from bulkembed.contracts import part_name
from bulkembed.errors import InputError
from bulkembed.sources.base import ReadSettings
from bulkembed.sources.columns import (
    is_binary_type,
    is_int64_compatible,
    is_text_type,
    json_type,
    passthrough_type,
    unify,
)
from bulkembed.sources.formats import format_of
from bulkembed.sources.image_columns import IMAGES_PER_CHUNK, as_images
from bulkembed.sources.long_texts import TextCut
from bulkembed.sources.records import Chunk, InputFile

DEFAULT_ID_COLUMN = "id"
DEFAULT_CHUNK_SIZE = 512
# What a run's chunks of short texts may grow to (`ReadSettings.chunk_rows`).
SHORT_CHUNK_SIZE = 4096


class RecordReader:
    """Chunks of every input file in order, but for the units in a skip set (part names).

    `check()` reads every file's columns (a Parquet footer, a JSONL file's first records)
    before any record is read, so a wrong column name fails at once, and fixes the type of
    the `id` column for the whole run: int64 when every file is tabular with an integer id
    column (and one at least can be read), else string (integer ids then written in
    decimal).

    `keep_columns` are passed through with every record. Their types (`column_types`) come
    from the first file that has them: a schema, or the first JSON lines' values. With
    `text_cut`, texts too long for the model to read whole are cut as chunks are read
    (`long_texts`)."""

    def __init__(
        self,
        files: list[InputFile],
        text_column: str = "text",
        id_column: str | None = None,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        records_per_unit: int = DEFAULT_RECORDS_PER_UNIT,
        keep_columns: tuple[str, ...] = (),
        short_chunk_size: int | None = None,
        text_cut: TextCut | None = None,
        images: bool = False,
    ) -> None:
        self.files = files
        # Records of images: `text_column` is the image column (`sources.images`).
        self.images = images
        if images:
            chunk_size = short_chunk_size = IMAGES_PER_CHUNK
        self.text_cut = text_cut
        self.short_chunk_size = short_chunk_size or chunk_size
        self.text_column = text_column
        self.id_column = id_column
        self.chunk_size = chunk_size
        self.records_per_unit = records_per_unit
        self.keep_columns = keep_columns
        self._id_columns: dict[int, str | None] = {}
        self.id_type: pa.DataType | None = None
        self.column_types: dict[str, pa.DataType] = {}

    def check(self) -> pa.DataType:
        """Check every file's text and id columns; return the run's id type."""
        integer_ids = True
        schemas = 0
        for index, file in enumerate(self.files):
            kind = format_of(file)
            if kind.images:
                # Its records are images, named by their paths or keys: no column to check.
                if self.id_column is not None:
                    raise InputError(
                        f"--id-column: {file.path} holds images, whose ids are their paths "
                        "(an image folder) or keys (WebDataset shards): leave it out"
                    )
                self._id_columns[index] = None
                integer_ids = False
                self._image_keep_columns(file)
                continue
            if kind.tabular:
                schema = kind.schema(file)
                if schema is None:
                    continue
                schemas += 1
                id_column = self._check_columns(schema.names, str(file.path))
                text_type = schema.field(self.text_column).type
                textual = is_text_type(text_type) or is_binary_type(text_type)
                if not self.images and not textual:
                    raise InputError(
                        f"text column '{self.text_column}' in {file.path} holds {text_type}, "
                        "not strings"
                    )
                id_type = schema.field(id_column).type if id_column else None
                integer_ids &= id_type is not None and is_int64_compatible(id_type)
                for name in self.keep_columns:
                    self._set_column_type(name, passthrough_type(schema, name, str(file.path)))
            else:
                records, line = kind.sample(file)
                integer_ids = False
                if not records:
                    id_column = None
                else:
                    # A JSON file's columns: the fields of its first records, all of them.
                    fields = list(dict.fromkeys(key for record in records for key in record))
                    id_column = self._check_columns(fields, f"{file.path} from line {line}")
                for name in self.keep_columns:
                    values = [r.get(name) for r in records if r.get(name) is not None]
                    if values and name not in self.column_types:
                        self._set_column_type(name, json_type(values, name, str(file.path)))
            self._id_columns[index] = id_column
        for name in self.keep_columns:
            if name not in self.column_types:
                self._set_column_type(name, self._scan_type(name))
            if pa.types.is_null(self.column_types[name]):
                self.column_types[name] = pa.string()
        self.id_type = pa.int64() if integer_ids and schemas else pa.string()
        return self.id_type

    def _image_keep_columns(self, file: InputFile) -> None:
        """The passthrough columns of an input of images: a WebDataset sample's text
        members; an image folder has none."""
        from bulkembed.sources.webdataset import TEXT_MEMBERS, WebDatasetFormat

        for name in self.keep_columns:
            if file.format != WebDatasetFormat.name or name not in TEXT_MEMBERS:
                raise InputError(
                    f"--keep-columns '{name}': {file.path} holds images, whose columns are "
                    f"their samples' {' and '.join(TEXT_MEMBERS)} members (WebDataset shards)"
                )
            self._set_column_type(name, pa.string())

    def _settings(self, index: int) -> ReadSettings:
        if self.id_type is None:
            self.check()
        assert self.id_type is not None
        return ReadSettings(
            self.text_column,
            self._id_columns.get(index),
            self.keep_columns,
            self.column_types,
            self.id_type,
            self.chunk_size,
            self.records_per_unit,
            self.short_chunk_size,
            self.text_cut,
            self.images,
        )

    def read(self, skip: Container[str] = ()) -> Iterator[Chunk]:
        """The chunks of every file, in order, but for the units in `skip`."""
        for index in range(len(self.files)):
            yield from self.read_file(index, skip)

    def read_file(self, index: int, skip: Container[str] = ()) -> Iterator[Chunk]:
        """The chunks of the file at `index` alone, but for its units in `skip`."""
        file = self.files[index]
        for chunk in format_of(file).read(index, file, self._settings(index), skip):
            yield self._cut(chunk, file)

    def read_unit(self, index: int, unit: int, offset: int | None) -> Iterator[Chunk]:
        """The chunks of unit `unit` of the file at `index` alone: read from byte `offset`
        where the format can seek there (see `unit_offsets`), else from the start."""
        file = self.files[index]
        skip = _AllBut(part_name(index, unit))
        settings = self._settings(index)
        for chunk in format_of(file).read_from(index, file, settings, skip, unit, offset):
            yield self._cut(chunk, file)
            if chunk.last_in_unit:
                return

    def _cut(self, chunk: Chunk, file: InputFile) -> Chunk:
        """`chunk` with its long texts cut (`text_cut`), or its images as the decoding
        processes take them (`sources.image_columns.as_images`)."""
        if self.images:
            return as_images(chunk, file)
        if self.text_cut is not None:
            self.text_cut.apply(chunk)
        return chunk

    def unit_offsets(self, index: int) -> list[int] | None:
        """Where each unit of the file at `index` starts, in bytes, if it can be read from
        there (an uncompressed JSON-lines file)."""
        file = self.files[index]
        return format_of(file).unit_offsets(file, self.records_per_unit)

    def _scan_type(self, name: str) -> pa.DataType:
        """The type of a field that the first records of every file lack: from its first
        values further on. A field in no record at all is an error (a misspelt name), unless
        a streamed dataset, which cannot be read ahead, may hold it."""
        for file in self.files:
            values = format_of(file).values(file, name)
            if values:
                return json_type(values, name, str(file.path))
        if any(format_of(file).streamed for file in self.files):
            return pa.string()
        raise InputError(
            f"--keep-columns '{name}' has a value in no record of the inputs: check the name"
        )

    def _set_column_type(self, name: str, kind: pa.DataType) -> None:
        """A passthrough column's type over every file: the same type, or the one that
        holds both (int64 for integers, float64 for numbers, string for strings)."""
        first = self.column_types.setdefault(name, kind)
        unified = unify(first, kind)
        if unified is None:
            raise InputError(
                f"--keep-columns '{name}' is {first} in one input and {kind} in another: "
                "make the inputs agree"
            )
        self.column_types[name] = unified

    def _check_columns(self, columns: list[str], source: str) -> str | None:
        """The id column to use (None: ids from the file name); an error if one is missing."""
        if self.text_column not in columns:
            what = "image" if self.images else "text"
            raise InputError(
                f"{what} column '{self.text_column}' not found in {source}; "
                f"columns: {', '.join(columns) or 'none'} (choose one with --{what}-column)"
            )
        if self.id_column is None:
            return DEFAULT_ID_COLUMN if DEFAULT_ID_COLUMN in columns else None
        if self.id_column not in columns:
            raise InputError(
                f"id column '{self.id_column}' not found in {source}; "
                f"columns: {', '.join(columns) or 'none'} (choose one with --id-column)"
            )
        return self.id_column


class _AllBut:
    """Every unit but one: the skip set of a single unit's read."""

    def __init__(self, unit: str) -> None:
        self.unit = unit

    def __contains__(self, part: object) -> bool:
        return part != self.unit

"""CSV and TSV inputs (`.csv`, `.tsv`): a header row names the columns, and every value is
read as text (a CSV file has no types: a column of numbers would otherwise change type
from one block to the next), so ids from an id column are strings. Quoted values may hold
the delimiter and newlines. One unit per `records_per_unit` rows, read a block at a time
as Arrow record batches (`arrow.ArrowFormat`'s reading). An empty file holds no record.
A row of another number of fields than the header is left out and quarantined, with its
fields counted and its start shown (its `row` is the first of its block of about a
megabyte: the parser does not count rows across quoted newlines); a block that cannot be
read (bytes that are not UTF-8) has the rest of the file quarantined with the reader's
reason, as the rest of a damaged Arrow file is. An unclosed quote runs to the end of the
file: its value holds the rest.

CSV and TSV files are read where an input names them or a glob matches them, not where an
input directory holds them (`in_folders`): a folder of Parquet or JSON lines files often
holds CSV files that are not input.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Container, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv

from bulkembed.errors import InputError
from bulkembed.sources.arrow import ArrowFormat
from bulkembed.sources.base import ReadSettings
from bulkembed.sources.records import Chunk, InputFile
from bulkembed.storage import ObjectPath


class DelimitedFormat(ArrowFormat):
    """`.csv` files, comma-separated, and `.tsv` files, tab-separated."""

    name = "csv"
    suffixes = (".csv", ".tsv")
    in_folders = False

    def batches(self, file: InputFile) -> pa.RecordBatchReader:
        return _reader(file, lambda row: "skip")

    def schema(self, file: InputFile) -> pa.Schema | None:
        return None if file.size == 0 else super().schema(file)

    def read(
        self, index: int, file: InputFile, settings: ReadSettings, skip: Container[str]
    ) -> Iterator[Chunk]:
        left_out: list[str] = []

        def handle(row: Any) -> str:
            text = str(row.text)
            shown = text if len(text) <= _SHOWN else text[:_SHOWN] + "..."
            fields = f"a row of {row.actual_columns} fields"
            left_out.append(f"{fields} where the header has {row.expected_columns}: {shown!r}")
            return "skip"

        def batches() -> Iterator[tuple[pa.RecordBatch, list[str]]]:
            # The rows left out while a batch was parsed go with it (one block at a time).
            for batch in _reader(file, handle):
                yield batch, left_out.copy()
                left_out.clear()

        return self.read_batches(index, file, settings, skip, batches())


# How much of a row left out its reason shows.
_SHOWN = 80


def _reader(file: InputFile, handle: Callable[[Any], str]) -> pa.RecordBatchReader:
    """The file's record batches, every column as text; `handle` says what to do with a
    row of another number of fields than the header ("skip" it)."""
    if file.size == 0:
        return pa.RecordBatchReader.from_batches(pa.schema([]), [])
    delimiter = "\t" if file.path.name.lower().endswith(".tsv") else ","
    parse = pacsv.ParseOptions(
        delimiter=delimiter, newlines_in_values=True, invalid_row_handler=handle
    )
    # The header read on its own: the rows it meets are told of once, by the reading.
    names = _header(file, pacsv.ParseOptions(delimiter=delimiter, newlines_in_values=True))
    twice = [name for name, count in Counter(names).items() if count > 1]
    if twice:
        raise InputError(f"{file.path}: its header names the column {twice[0]!r} twice: rename one")
    text = pacsv.ConvertOptions(
        column_types=dict.fromkeys(names, pa.string()), strings_can_be_null=False
    )
    return _open(file, parse, text)[0]


def _header(file: InputFile, parse: pacsv.ParseOptions) -> list[str]:
    """The column names of the file's header row."""
    parse.invalid_row_handler = lambda row: "skip"
    reader, source = _open(file, parse, None)
    try:
        return list(reader.schema.names)
    finally:
        source.close()


def _open(
    file: InputFile, parse: pacsv.ParseOptions, convert: pacsv.ConvertOptions | None
) -> tuple[pa.RecordBatchReader, pa.NativeFile]:
    """A reader of the file's record batches, one block at a time in this thread (so that
    the rows a block leaves out are known when its batch comes), and the file it reads."""
    path = file.path
    source = path.open_input() if isinstance(path, ObjectPath) else pa.OSFile(str(path))
    serial = pacsv.ReadOptions(use_threads=False)
    reader = pacsv.open_csv(
        source, read_options=serial, parse_options=parse, convert_options=convert
    )
    return reader, source

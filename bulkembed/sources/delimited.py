"""CSV and TSV inputs (`.csv`, `.tsv`): a header row names the columns, and every value is
read as text (a CSV file has no types: a column of numbers would otherwise change type
from one block to the next), so ids from an id column are strings. Quoted values may hold
the delimiter and newlines. One unit per `records_per_unit` rows, read a block at a time
as Arrow record batches (`arrow.ArrowFormat`'s reading). An empty file holds no record.
A row of another number of fields than the header stops the parse at its block: the rest
of the file is quarantined with the parser's reason, as the rest of a damaged Arrow file
is.

CSV and TSV files are read where an input names them or a glob matches them, not where an
input directory holds them (`in_folders`): a folder of Parquet or JSON lines files often
holds CSV files that are not input.
"""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pyarrow.csv as pacsv

from bulkembed.errors import InputError
from bulkembed.sources.arrow import ArrowFormat
from bulkembed.sources.records import InputFile
from bulkembed.storage import ObjectPath


class DelimitedFormat(ArrowFormat):
    """`.csv` files, comma-separated, and `.tsv` files, tab-separated."""

    name = "csv"
    suffixes = (".csv", ".tsv")
    in_folders = False

    def batches(self, file: InputFile) -> pa.RecordBatchReader:
        if file.size == 0:
            return pa.RecordBatchReader.from_batches(pa.schema([]), [])
        parse = pacsv.ParseOptions(
            delimiter="\t" if file.path.name.lower().endswith(".tsv") else ",",
            newlines_in_values=True,
        )
        names = _header(file, parse)
        twice = [name for name, count in Counter(names).items() if count > 1]
        if twice:
            raise InputError(
                f"{file.path}: its header names the column {twice[0]!r} twice: rename one"
            )
        text = pacsv.ConvertOptions(
            column_types=dict.fromkeys(names, pa.string()), strings_can_be_null=False
        )
        return _open(file, parse, text)[0]

    def schema(self, file: InputFile) -> pa.Schema | None:
        return None if file.size == 0 else super().schema(file)


def _header(file: InputFile, parse: pacsv.ParseOptions) -> list[str]:
    """The column names of the file's header row."""
    reader, source = _open(file, parse, None)
    try:
        return list(reader.schema.names)
    finally:
        source.close()


def _open(
    file: InputFile, parse: pacsv.ParseOptions, convert: pacsv.ConvertOptions | None
) -> tuple[pa.RecordBatchReader, pa.NativeFile]:
    """A reader of the file's record batches, and the file it reads."""
    path = file.path
    source = path.open_input() if isinstance(path, ObjectPath) else pa.OSFile(str(path))
    return pacsv.open_csv(source, parse_options=parse, convert_options=convert), source

"""CSV and TSV inputs (`.csv`, `.tsv`): a header row names the columns, and every value is
read as text (a CSV file has no types: a column of numbers would otherwise change type
from one block to the next), so ids from an id column are strings. Quoted values may hold
the delimiter and newlines. One unit per `records_per_unit` rows, read a block at a time
as Arrow record batches (`arrow.ArrowFormat`'s reading). A row of another number of fields
than the header stops the parse at its block: the rest of the file is quarantined with the
parser's reason, as the rest of a damaged Arrow file is."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.csv as pacsv

from bulkembed.sources.arrow import ArrowFormat
from bulkembed.sources.records import InputFile
from bulkembed.storage import ObjectPath


class DelimitedFormat(ArrowFormat):
    """`.csv` files, comma-separated, and `.tsv` files, tab-separated."""

    name = "csv"
    suffixes = (".csv", ".tsv")

    def batches(self, file: InputFile) -> pa.RecordBatchReader:
        parse = pacsv.ParseOptions(
            delimiter="\t" if file.path.name.lower().endswith(".tsv") else ",",
            newlines_in_values=True,
        )
        names = _open(file, parse, None).schema.names
        text = pacsv.ConvertOptions(
            column_types=dict.fromkeys(names, pa.string()), strings_can_be_null=False
        )
        return _open(file, parse, text)


def _open(
    file: InputFile, parse: pacsv.ParseOptions, convert: pacsv.ConvertOptions | None
) -> pa.RecordBatchReader:
    path = file.path
    source = path.open_input() if isinstance(path, ObjectPath) else pa.OSFile(str(path))
    reader: pa.RecordBatchReader = pacsv.open_csv(
        source, parse_options=parse, convert_options=convert
    )
    return reader

"""The built-in input formats, registered (`registry`), and what is counted over every
input: records and units."""

from __future__ import annotations

from bulkembed.contracts import part_name
from bulkembed.sources.arrow import ArrowFormat
from bulkembed.sources.delimited import DelimitedFormat
from bulkembed.sources.hf import DatasetFormat
from bulkembed.sources.images import ImageFolderFormat
from bulkembed.sources.jsonl import JsonLinesFormat
from bulkembed.sources.opening import READ_ERRORS
from bulkembed.sources.parquet import ParquetFormat
from bulkembed.sources.records import InputFile
from bulkembed.sources.registry import format_of, register_format
from bulkembed.sources.webdataset import WebDatasetFormat
from bulkembed.storage import stop_on_store_failure

for _builtin in (ParquetFormat(), JsonLinesFormat(), ArrowFormat(), ImageFolderFormat()):
    register_format(_builtin)
register_format(WebDatasetFormat())
register_format(DelimitedFormat())
register_format(DatasetFormat())


def count_records(files: list[InputFile]) -> int:
    """Records in all files, for progress. Unreadable files count as empty."""
    total = 0
    for file in files:
        try:
            total += format_of(file).records(file)
        except READ_ERRORS as e:
            stop_on_store_failure(file.path, e)
    return total


def unit_names(files: list[InputFile], records_per_unit: int) -> list[str]:
    """Every unit of work of the files, as part names, in order. An unreadable file is one
    unit. Parquet units come from the footer; JSON lines and Arrow files are read through to
    count lines and rows; streamed datasets are not counted (see `InputFormat.streamed`)."""
    names: list[str] = []
    for index, file in enumerate(files):
        try:
            units = format_of(file).units(file, records_per_unit)
        except READ_ERRORS as e:
            stop_on_store_failure(file.path, e)
            units = 1
        names.extend(part_name(index, unit) for unit in range(max(units, 1)))
    return names

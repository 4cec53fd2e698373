"""Input files, listed in a deterministic order and streamed in small chunks.

An input file is read by its format (`parquet`, `jsonl`, `arrow`, `delimited`: CSV and
TSV, `hf`: one class each), found by the registry (`registry`: `register_format`).
A unit of work is a Parquet row group or a fixed number of records of the other formats;
it is the granularity of output parts and of resume.
"""

from bulkembed.sources.files import list_inputs
from bulkembed.sources.filters import SeenIds
from bulkembed.sources.formats import count_records, unit_names
from bulkembed.sources.id_keys import IdKey
from bulkembed.sources.opening import unit_offsets
from bulkembed.sources.reader import RecordReader
from bulkembed.sources.records import BadRecord, Chunk, InputFile
from bulkembed.sources.registry import format_of, readable, register_format, unregister_format

__all__ = [
    "BadRecord",
    "Chunk",
    "IdKey",
    "RecordReader",
    "SeenIds",
    "InputFile",
    "count_records",
    "format_of",
    "list_inputs",
    "readable",
    "register_format",
    "unit_names",
    "unit_offsets",
    "unregister_format",
]

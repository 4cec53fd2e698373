"""Input shards, listed in a deterministic order and streamed in small chunks.

A shard is one file. A unit of work is a Parquet row group or a fixed range of JSONL lines;
it is the granularity of output parts and of resume.
"""

from bulkembed.sources.files import (
    count_records,
    list_shards,
    unit_names,
    unit_offsets,
)
from bulkembed.sources.filters import SeenIds, drop_duplicate_ids, take
from bulkembed.sources.reader import RecordReader
from bulkembed.sources.records import BadRecord, Chunk, Shard

__all__ = [
    "BadRecord",
    "Chunk",
    "RecordReader",
    "SeenIds",
    "Shard",
    "count_records",
    "drop_duplicate_ids",
    "list_shards",
    "take",
    "unit_names",
    "unit_offsets",
]

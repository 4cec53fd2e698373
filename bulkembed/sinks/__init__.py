"""Where embeddings go: Parquet parts, a LanceDB table, or stdout.

`--output` names the target: a directory, `lancedb://PATH[?table=NAME]`, or `-`.
"""

from bulkembed.sinks.base import Sink
from bulkembed.sinks.factory import make_sink, sink_of
from bulkembed.sinks.lance import IndexSettings, LanceSink
from bulkembed.sinks.parquet import ParquetSink
from bulkembed.sinks.stream import StreamFormat, StreamSink
from bulkembed.sinks.target import OutputTarget, parse_output

__all__ = [
    "IndexSettings",
    "LanceSink",
    "OutputTarget",
    "ParquetSink",
    "Sink",
    "StreamFormat",
    "StreamSink",
    "make_sink",
    "parse_output",
    "sink_of",
]

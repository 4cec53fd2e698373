"""Where embeddings go. Every sink writes parts that become visible only when committed."""

from bulkembed.sinks.base import Sink
from bulkembed.sinks.parquet import ParquetSink

__all__ = ["ParquetSink", "Sink"]

"""The sink a parsed `--output` writes to."""

from __future__ import annotations

import sys

from bulkembed.config import RunConfig, StreamFormat
from bulkembed.errors import UsageError
from bulkembed.sinks.base import Sink
from bulkembed.sinks.lance import IndexSettings, IntentLog, LanceSink
from bulkembed.sinks.parquet import ParquetSink
from bulkembed.sinks.stream import StreamSink
from bulkembed.sinks.target import OutputTarget


def make_sink(
    target: OutputTarget, config: RunConfig, normalize: bool, intents: IntentLog | None = None
) -> Sink:
    """Parquet parts, a LanceDB table (with `--index` and `--fts` settings, writing its
    intents to `intents`) or stdout."""
    if target.kind == "stdout":
        # A buffered writer of its own: `sys.stdout.buffer` is a raw file when Python runs
        # unbuffered, and a raw write may take only part of what it is given.
        stdout = open(sys.stdout.fileno(), "wb", closefd=False)  # noqa: SIM115 (process-long)
        return StreamSink(stdout, config.stream_format or StreamFormat.JSONL)
    assert target.path is not None
    if target.kind == "lancedb":
        index = None
        if config.index:
            metric = "cosine" if normalize else "dot"
            index = IndexSettings(config.index_type.value, config.index_partitions, metric)
        fts = config.text_column if config.fts else None
        return LanceSink(target.path, target.table or "", index, fts, intents)
    return ParquetSink(target.path)


def sink_of(target: OutputTarget) -> Sink:
    """The sink of an existing output, to read what it holds (`bulkembed status`)."""
    if target.path is None:
        raise UsageError("a stream (--output -) keeps no run directory to report on")
    if target.kind == "lancedb":
        return LanceSink(target.path, target.table or "")
    return ParquetSink(target.path)

"""The kinds of output bulkembed has built in: a directory of Parquet parts, a LanceDB table
(`lancedb://PATH[?table=NAME]`), and stdout (`-`).

A directory may be a local path or an object-storage URI (`s3://BUCKET/PREFIX`, `gs://...`,
`az://...`); a LanceDB database on object storage is `lancedb+s3://BUCKET/PREFIX` (likewise
`lancedb+gs://`, `lancedb+az://`), with `?table=NAME` as for a local one.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from urllib.parse import parse_qs

from bulkembed.contracts import RUN_DIRECTORY
from bulkembed.errors import UsageError
from bulkembed.sinks.base import Sink
from bulkembed.sinks.change_set import ParquetChangeSet
from bulkembed.sinks.lance import LanceSink
from bulkembed.sinks.lance_index import DEFAULT_TABLE, IndexSettings
from bulkembed.sinks.lance_sync import in_place
from bulkembed.sinks.parquet import ParquetSink
from bulkembed.sinks.registry import (
    Capabilities,
    OutputTarget,
    SinkKind,
    SinkSettings,
    register_sink,
)
from bulkembed.sinks.stream import StreamSink
from bulkembed.storage import SCHEMES, StorageOptions, location

LANCEDB_SCHEME = "lancedb://"
# `lancedb+s3://BUCKET/PREFIX`: a LanceDB database on object storage.
_LANCEDB_PREFIX = "lancedb+"
STDOUT = "-"
# LanceDB's rule for table names; "." and ".." are refused besides.
_TABLE_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def _parquet(output: str, options: StorageOptions | None) -> OutputTarget:
    """Any other `--output`: a directory of Parquet parts, with its run directory inside."""
    path = location(output, options)
    return OutputTarget("parquet", str(path), path, None, path / RUN_DIRECTORY)


def _open_parquet(target: OutputTarget, settings: SinkSettings) -> Sink:
    assert target.path is not None
    return ParquetSink(target.path)


def _lancedb_location(output: str) -> tuple[str, str] | None:
    """(where the database is, the query) of a LanceDB `--output`; None for another kind."""
    if output.startswith(LANCEDB_SCHEME):
        where, _, query = output.removeprefix(LANCEDB_SCHEME).partition("?")
        return where, query
    scheme, sep, rest = output.partition("://")
    store = scheme.removeprefix(_LANCEDB_PREFIX)
    if sep and scheme.startswith(_LANCEDB_PREFIX) and store in SCHEMES:
        where, _, query = rest.partition("?")
        return (f"{store}://{where}" if where else ""), query
    return None


def _lancedb(output: str, options: StorageOptions | None) -> OutputTarget | None:
    """`lancedb://PATH[?table=NAME]` or `lancedb+s3://...`, checked; the table's run
    directory is `PATH/_bulkembed/NAME/`."""
    found = _lancedb_location(output)
    if found is None:
        return None
    where, query = found
    fields = parse_qs(query, keep_blank_values=True)
    unknown = sorted(set(fields) - {"table"})
    if unknown or not where:
        raise UsageError(f"--output {output}: write lancedb://PATH or lancedb://PATH?table=NAME")
    table = fields.get("table", [DEFAULT_TABLE])[-1]
    if not _TABLE_NAME.fullmatch(table) or table in (".", ".."):
        raise UsageError(
            f"--output {output}: a table name is a plain name of letters, digits, '_', '-' "
            "and '.' (not '.' or '..')"
        )
    path = location(where, options)
    scheme = LANCEDB_SCHEME if isinstance(path, Path) else _LANCEDB_PREFIX
    label = f"{scheme}{path}?table={table}"
    return OutputTarget("lancedb", label, path, table, path / RUN_DIRECTORY / table)


def _open_lancedb(target: OutputTarget, settings: SinkSettings) -> Sink:
    assert target.path is not None and target.name is not None
    index = None
    if settings.index is not None:
        index = IndexSettings(settings.index, settings.index_partitions, settings.metric)
    return LanceSink(
        target.path,
        target.name,
        index,
        settings.fts_column,
        settings.intents,
        text_column=settings.text_column,
    )


def _stdout(output: str, options: StorageOptions | None) -> OutputTarget | None:
    return OutputTarget("stdout", "stdout") if output == STDOUT else None


def _open_stdout(target: OutputTarget, settings: SinkSettings) -> Sink:
    # A buffered writer of its own: `sys.stdout.buffer` is a raw file when Python runs
    # unbuffered, and a raw write may take only part of what it is given.
    stdout = open(sys.stdout.fileno(), "wb", closefd=False)  # noqa: SIM115 (process-long)
    return StreamSink(stdout, settings.stream_format)


PARQUET = SinkKind(
    "parquet",
    _parquet,
    _open_parquet,
    Capabilities(many_writers=True),
    change_set=ParquetChangeSet,
)
LANCEDB = SinkKind(
    "lancedb", _lancedb, _open_lancedb, Capabilities(many_writers=True, indexes=True), in_place
)
STREAM = SinkKind("stdout", _stdout, _open_stdout, Capabilities(resumable=False, streamed=True))


def register_builtin_sinks() -> None:
    """Register the built-in kinds; a plain directory is asked last."""
    for kind in (PARQUET, LANCEDB, STREAM):
        register_sink(kind)

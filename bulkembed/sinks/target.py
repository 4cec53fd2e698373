"""`--output` parsed: a directory of Parquet parts, `lancedb://PATH[?table=NAME]`, or `-`.

A directory may be a local path or an object-storage URI (`s3://BUCKET/PREFIX`, `gs://...`,
`az://...`); a LanceDB database on object storage is `lancedb+s3://BUCKET/PREFIX` (likewise
`lancedb+gs://`, `lancedb+az://`), with `?table=NAME` as for a local one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs

from bulkembed.contracts import RUN_DIRECTORY
from bulkembed.errors import UsageError
from bulkembed.sinks.lance import DEFAULT_TABLE
from bulkembed.storage import SCHEMES, AnyPath, StorageOptions, location

LANCEDB_SCHEME = "lancedb://"
# `lancedb+s3://BUCKET/PREFIX`: a LanceDB database on object storage.
_LANCEDB_PREFIX = "lancedb+"
STDOUT = "-"
# LanceDB's rule for table names; "." and ".." are refused besides.
_TABLE_NAME = re.compile(r"[A-Za-z0-9_.-]+")


@dataclass(frozen=True, slots=True)
class OutputTarget:
    """A parsed `--output`: `kind` is parquet, lancedb or stdout."""

    kind: str
    path: AnyPath | None = None
    table: str | None = None

    @property
    def run_directory(self) -> AnyPath | None:
        """Where the run's ledger lives; None for stdout, which keeps none."""
        if self.kind == "parquet":
            assert self.path is not None
            return self.path / RUN_DIRECTORY
        if self.kind == "lancedb":
            assert self.path is not None and self.table is not None
            return self.path / RUN_DIRECTORY / self.table
        return None

    @property
    def label(self) -> str:
        if self.kind == "lancedb":
            if isinstance(self.path, Path):
                return f"{LANCEDB_SCHEME}{self.path}?table={self.table}"
            return f"{_LANCEDB_PREFIX}{self.path}?table={self.table}"
        return "stdout" if self.kind == "stdout" else str(self.path)


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


def parse_output(output: str, options: StorageOptions | None = None) -> OutputTarget:
    """`OUT`, `lancedb://PATH[?table=NAME]`, `lancedb+s3://...` or `-`, checked; `options`
    reach object storage."""
    if not output.strip():
        raise UsageError(
            "--output is empty: name a directory, lancedb://PATH?table=NAME, or - for stdout"
        )
    if output == STDOUT:
        return OutputTarget("stdout")
    lancedb = _lancedb_location(output)
    if lancedb is None:
        return OutputTarget("parquet", location(output, options))
    where, query = lancedb
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
    return OutputTarget("lancedb", location(where, options), table)

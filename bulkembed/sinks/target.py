"""`--output` parsed: a directory of Parquet parts, `lancedb://PATH[?table=NAME]`, or `-`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs

from bulkembed.contracts import RUN_DIRECTORY
from bulkembed.errors import BulkembedError
from bulkembed.sinks.lance import DEFAULT_TABLE

LANCEDB_SCHEME = "lancedb://"
STDOUT = "-"
# LanceDB's rule for table names; "." and ".." are refused besides.
_TABLE_NAME = re.compile(r"[A-Za-z0-9_.-]+")


@dataclass(frozen=True, slots=True)
class OutputTarget:
    """A parsed `--output`: `kind` is parquet, lancedb or stdout."""

    kind: str
    path: Path | None = None
    table: str | None = None

    @property
    def run_directory(self) -> Path | None:
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
            return f"{LANCEDB_SCHEME}{self.path}?table={self.table}"
        return "stdout" if self.kind == "stdout" else str(self.path)


def parse_output(output: str) -> OutputTarget:
    """`OUT`, `lancedb://PATH[?table=NAME]` or `-`, checked."""
    if not output.strip():
        raise BulkembedError(
            "--output is empty: name a directory, lancedb://PATH?table=NAME, or - for stdout"
        )
    if output == STDOUT:
        return OutputTarget("stdout")
    if not output.startswith(LANCEDB_SCHEME):
        return OutputTarget("parquet", Path(output).expanduser())
    location, _, query = output.removeprefix(LANCEDB_SCHEME).partition("?")
    options = parse_qs(query, keep_blank_values=True)
    unknown = sorted(set(options) - {"table"})
    if unknown or not location:
        raise BulkembedError(
            f"--output {output}: write lancedb://PATH or lancedb://PATH?table=NAME"
        )
    table = options.get("table", [DEFAULT_TABLE])[-1]
    if not _TABLE_NAME.fullmatch(table) or table in (".", ".."):
        raise BulkembedError(
            f"--output {output}: a table name is a plain name of letters, digits, '_', '-' "
            "and '.' (not '.' or '..')"
        )
    return OutputTarget("lancedb", Path(location).expanduser(), table)

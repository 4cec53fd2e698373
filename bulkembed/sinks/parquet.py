"""Parquet parts in the output directory, written under a temporary name and then renamed."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from bulkembed.errors import OutputError
from bulkembed.sinks.base import Sink

TEMPORARY_SUFFIX = ".parquet.tmp"


class ParquetSink(Sink):
    """`OUT/<part>.parquet`, one file per committed part."""

    def __init__(self, directory: Path, schema: pa.Schema) -> None:
        self.directory = directory
        self.schema = schema
        self._open: dict[str, pq.ParquetWriter] = {}

    def _temporary(self, part: str) -> Path:
        return self.directory / f".{part}{TEMPORARY_SUFFIX}"

    def write(self, part: str, batch: pa.RecordBatch) -> None:
        try:
            writer = self._open.get(part)
            if writer is None:
                writer = pq.ParquetWriter(self._temporary(part), self.schema)
                self._open[part] = writer
            writer.write_batch(batch)
        except OSError as e:
            raise OutputError(f"cannot write {self._temporary(part)}: {e}") from e

    def commit(self, part: str) -> None:
        writer = self._open.pop(part, None)
        if writer is None:
            return
        temporary = self._temporary(part)
        try:
            writer.close()
            with open(temporary, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(temporary, self.directory / f"{part}.parquet")
        except OSError as e:
            temporary.unlink(missing_ok=True)
            raise OutputError(f"cannot commit {temporary}: {e}") from e
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise

    def close(self) -> None:
        """Drop every uncommitted part; errors closing them (a full disk) do not matter then."""
        for part, writer in list(self._open.items()):
            with contextlib.suppress(OSError):
                writer.close()
            self._temporary(part).unlink(missing_ok=True)
        self._open.clear()

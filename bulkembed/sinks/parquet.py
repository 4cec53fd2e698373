"""Parquet parts in the output directory, written under a temporary name and then renamed."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from bulkembed.errors import OutputError
from bulkembed.sinks.base import Sink

if TYPE_CHECKING:
    from bulkembed.checkpoint import UnitRecord

TEMPORARY_SUFFIX = ".parquet.tmp"
_PART = re.compile(r"part-\d{5,}-\d{6,}")


class ParquetSink(Sink):
    """`OUT/<part>.parquet`, one file per committed part."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        # Temporary files carry their writer's own tag: a worker of a killed Ray run may
        # still be writing the unit that the rerun writes too.
        self._tag = f"{os.getpid()}-{secrets.token_hex(3)}"
        self.schema: pa.Schema | None = None
        self._open: dict[str, pq.ParquetWriter] = {}

    @property
    def description(self) -> str:
        return str(self.directory)

    def part_path(self, part: str) -> Path:
        return self.directory / f"{part}.parquet"

    def _temporary(self, part: str) -> Path:
        return self.directory / f".{part}.{self._tag}{TEMPORARY_SUFFIX}"

    def _our_parts(self) -> list[Path]:
        return [p for p in self.directory.glob("part-*.parquet") if _PART.fullmatch(p.stem)]

    def _temporaries(self) -> list[Path]:
        return list(self.directory.glob(f".part-*{TEMPORARY_SUFFIX}"))

    def foreign_data(self) -> str | None:
        if self.directory.exists() and not self.directory.is_dir():
            raise OutputError(f"--output {self.directory} is a file; pass a directory")
        ours = set(self._our_parts())
        foreign = [p for p in self.directory.glob("*.parquet") if p not in ours]
        return (
            f"Parquet files that bulkembed did not write ({foreign[0].name})" if foreign else None
        )

    def remove(self) -> None:
        for path in [*self._our_parts(), *self._temporaries()]:
            path.unlink()

    def reconcile(self, done: dict[str, UnitRecord], parts: Collection[str] | None = None) -> None:
        for path in self._temporaries():
            if parts is None or path.name[1:].split(".")[0] in parts:
                path.unlink(missing_ok=True)
        for record in done.values():
            if record.rows and not self.part_path(record.part).exists():
                raise OutputError(
                    f"{self.part_path(record.part)} is missing but its unit is marked done: "
                    "restore the file, or use --overwrite"
                )
        for path in self._our_parts():
            if path.stem not in done and (parts is None or path.stem in parts):
                path.unlink(missing_ok=True)

    def committed_ids(self, done: dict[str, UnitRecord]) -> Iterator[Any]:
        for record in done.values():
            if record.rows:
                table = pq.read_table(self.part_path(record.part), columns=["id"])
                yield from table.column("id").to_pylist()

    def start(self, schema: pa.Schema) -> None:
        self.schema = schema

    def write(self, part: str, batch: pa.RecordBatch) -> None:
        assert self.schema is not None
        try:
            writer = self._open.get(part)
            if writer is None:
                writer = pq.ParquetWriter(self._temporary(part), self.schema)
                self._open[part] = writer
            writer.write_batch(batch)
        except OSError as e:
            raise OutputError(f"cannot write {self._temporary(part)}: {e}") from e

    def commit(self, part: str) -> dict[str, Any]:
        writer = self._open.pop(part, None)
        if writer is None:
            return {}
        temporary = self._temporary(part)
        try:
            writer.close()
            with open(temporary, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(temporary, self.part_path(part))
        except OSError as e:
            temporary.unlink(missing_ok=True)
            raise OutputError(f"cannot commit {temporary}: {e}") from e
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
        return {}

    def close(self) -> None:
        """Drop every uncommitted part; errors closing them (a full disk) do not matter then."""
        for part, writer in list(self._open.items()):
            with contextlib.suppress(OSError):
                writer.close()
            self._temporary(part).unlink(missing_ok=True)
        self._open.clear()

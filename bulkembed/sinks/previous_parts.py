"""The parts of a finished Parquet output, as an incremental run (`--since PREV`) reads them:
each part's ids and content hashes with its label, its vectors a row group at a time, a
part whole, its schema, and whether a part may be copied whole into the new output.

Every read verifies the pages' checksums (`storage.parquet_file`); a part that cannot be
read (cut short, damaged, gone) stops the run with one line that names it
(`reading_previous`). One part is held open at a time, and nothing open travels when the
reader is pickled into another process.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from bulkembed.errors import UsageError
from bulkembed.schema import CONTENT_HASH, EMBEDDING_COLUMNS, ENCODER_KEY
from bulkembed.sinks.part_files import part_label
from bulkembed.sources.records import reading_previous
from bulkembed.storage import AnyPath, parquet_file
from bulkembed.version import __version__


class PreviousParts:
    """The parts of PREV at `paths`, numbered in their order."""

    def __init__(self, paths: list[AnyPath]) -> None:
        self.paths = paths
        # The part open now: its number, its file and the first row of each row group.
        self._open: tuple[int, Any, np.ndarray] | None = None
        self._sizes: dict[int, int | None] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"paths": self.paths}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["paths"])  # type: ignore[misc]

    def __len__(self) -> int:
        return len(self.paths)

    def schema(self, number: int = 0) -> pa.Schema:
        """The Arrow schema of part `number`, with its metadata."""
        with reading_previous(self.paths[number]):
            return parquet_file(self.paths[number]).schema_arrow

    def labelled(self, columns: list[str]) -> Iterator[tuple[pa.Table, dict[str, Any] | None]]:
        """Each part's `columns` (of its ids and content hashes), and its label."""
        for path in self.paths:
            with reading_previous(path):
                file = parquet_file(path)
            if CONTENT_HASH not in file.schema_arrow.names:
                raise UsageError(
                    f"--since: {path} has no {CONTENT_HASH} column (written by an older "
                    "bulkembed); run without --since once"
                )
            label = part_label(file.metadata)
            with reading_previous(path):
                table = file.read(columns=columns)
            yield table, label

    def whole(self, number: int) -> pa.Table:
        """Every column of part `number`."""
        with reading_previous(self.paths[number]):
            return parquet_file(self.paths[number]).read()

    def group_starts(self, number: int) -> np.ndarray:
        """The first row of each row group of part `number`."""
        return self._file(number)[1]

    def group(self, number: int, group: int) -> pa.Table:
        """The output columns (`EMBEDDING_COLUMNS`) of row group `group` of part `number`."""
        file, _ = self._file(number)
        columns = [c for c in EMBEDDING_COLUMNS if c in file.schema_arrow.names]
        with reading_previous(self.paths[number]):
            return file.read_row_group(group, columns=columns)

    def row_bytes(self, number: int) -> int | None:
        """The bytes a row of part `number` takes, where the part may be copied as it is: a
        local file whose schema says this version of bulkembed wrote it, with its encoder's
        record (else this run's schema differs); None where it may not."""
        if number not in self._sizes:
            path, size = self.paths[number], None
            if isinstance(path, Path):
                with reading_previous(path):
                    file = parquet_file(path)
                metadata = file.schema_arrow.metadata or {}
                ours = metadata.get(b"bulkembed.version") == __version__.encode()
                if ours and ENCODER_KEY.encode() in metadata:
                    found = file.metadata
                    stored = sum(
                        found.row_group(g).total_byte_size for g in range(found.num_row_groups)
                    )
                    size = stored // max(1, found.num_rows)
            self._sizes[number] = size
        return self._sizes[number]

    def _file(self, number: int) -> tuple[Any, np.ndarray]:
        """Part `number`, opened, and the first row of each of its row groups."""
        if self._open is None or self._open[0] != number:
            with reading_previous(self.paths[number]):
                file = parquet_file(self.paths[number])
            sizes = [file.metadata.row_group(g).num_rows for g in range(file.num_row_groups)]
            self._open = (number, file, np.cumsum([0, *sizes[:-1]]))
        return self._open[1], self._open[2]

"""The change set of a `--since` run into a Parquet output, in its run directory
(`meta/changes/`): what takes the previous output to the new one.

- `changes/upserts/part-*.parquet`: the new and changed documents, with every output column
  (the parts' schema). A unit's upserts are committed just before its part, and the unit is
  marked done after both: a unit embedded again after a crash writes the same file again,
  under the same name, so each id is there exactly once, also after any number of restarts.
- `changes/deletes.parquet`: one column, `id`: the previous output's ids that the new output
  does not hold and that are gone (`bulkembed.incremental.deletions`: what could not be read
  is kept, not deleted). It is written once every unit is done, before the output is marked
  complete, from the previous output's parts and the new one's: a run resumed after a crash
  computes the same list. With `--limit` it is not written (the documents past the limit
  were not read).
"""

from __future__ import annotations

import io
import os
import secrets
from collections.abc import Collection

import pyarrow as pa
import pyarrow.parquet as pq

from bulkembed.errors import OutputError
from bulkembed.sinks.base import ChangeSet
from bulkembed.sinks.parquet import ParquetSink
from bulkembed.storage import AnyPath, ObjectPath

# The change set's folder in the run directory, and its files there.
CHANGES = "changes"
UPSERTS = "upserts"
DELETES = "deletes.parquet"


class ParquetChangeSet(ChangeSet):
    """The change set in `meta/changes/` (see the module's docstring): upserts a unit at a
    time, deletes once at the end."""

    def __init__(self, meta: AnyPath) -> None:
        self.directory = meta / CHANGES
        self.deletes_path = self.directory / DELETES

    def upserts(self) -> ParquetSink:
        """A sink for the upserts: one per writing process (its temporary files are its own)."""
        return ParquetSink(self.directory / UPSERTS)

    def open(self, mine: Collection[str] | None) -> None:
        """Make the folder, and drop what a crash left half-written (of the units in
        `mine`, when given). The upserts of a unit whose part was not committed stay: the
        unit is embedded again and writes the same file again, under the same name."""
        upserts = self.upserts()
        upserts.directory.mkdir(parents=True, exist_ok=True)
        upserts.remove_unfinished(mine)
        if not isinstance(self.directory, ObjectPath) and self.directory.is_dir():
            for temporary in self.directory.glob(f".{DELETES}.*.tmp"):
                temporary.unlink(missing_ok=True)

    def remove(self) -> None:
        """Delete the change set (`--overwrite`): bulkembed's own files, and nothing else."""
        upserts = self.upserts()
        if upserts.directory.is_dir():
            upserts.remove([])
        self.deletes_path.unlink(missing_ok=True)

    def write_deletes(self, ids: pa.ChunkedArray) -> None:
        """Write `deletes.parquet`: the ids of PREV that are gone."""
        self._write_whole(pa.table({"id": ids}))

    def _write_whole(self, table: pa.Table) -> None:
        """Write `deletes.parquet` whole or not at all (an object in one upload)."""
        buffer = io.BytesIO()
        pq.write_table(table, buffer, write_page_checksum=True)
        self.directory.mkdir(parents=True, exist_ok=True)
        if isinstance(self.deletes_path, ObjectPath):
            self.deletes_path.write_bytes(buffer.getvalue())
            return
        temporary = self.deletes_path.with_name(f".{DELETES}.{secrets.token_hex(4)}.tmp")
        try:
            with open(temporary, "wb") as f:
                f.write(buffer.getvalue())
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, self.deletes_path)
        except OSError as e:
            temporary.unlink(missing_ok=True)
            raise OutputError(f"cannot write {self.deletes_path}: {e}") from e

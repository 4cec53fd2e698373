"""Parquet parts in the output directory, written under a temporary name and then renamed
(on object storage: uploaded whole under their name).

On object storage, which has no rename, a part is written to a local spool file and
uploaded under its final name once complete: an object appears whole when its upload
completes, and a process killed during the upload leaves no object (only an unfinished
multipart upload, which the store does not list).

A part's footer carries its label (`part_files`). A part is bulkembed's own when its
footer says so or when the ledger names it; nothing else in the directory is ever deleted,
and a file that is named like a part but is not bulkembed's own is refused rather than
overwritten.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import secrets
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from bulkembed.contracts import RUN_DIRECTORY
from bulkembed.errors import OutputError
from bulkembed.sinks.base import Recovered, Sink, unfenced
from bulkembed.sinks.part_files import (
    LABEL_KEY,
    FooterError,
    copy_with_entry,
    pages_intact,
    part_label,
    part_path,
    writer_options,
)
from bulkembed.sources.opening import READ_ERRORS
from bulkembed.storage import AnyPath, ObjectPath, Spool, parquet_file, random_access

if TYPE_CHECKING:
    from bulkembed.contracts import UnitRecord

TEMPORARY_SUFFIX = ".parquet.tmp"
_PART = re.compile(r"part-\d{5,}-\d{6,}")
_PART_FILE = re.compile(_PART.pattern + r"\.parquet")
_TEMPORARY = re.compile(r"\.part-\d{5,}-\d{6,}\.[0-9a-f-]+" + re.escape(TEMPORARY_SUFFIX))
# Names shown when refusing a directory that holds other files.
_SHOWN = 3


class _Unreadable(Exception):
    """A file named like a part is not a readable Parquet file."""


def _label(path: AnyPath) -> dict[str, Any] | None:
    """The label in a part's footer; None if it has none (bulkembed did not write it)."""
    try:
        with random_access(path) as source:
            metadata = pq.read_metadata(source)
    except READ_ERRORS as e:
        raise _Unreadable(str(e)) from e
    return part_label(metadata)


def _not_ours(path: AnyPath) -> OutputError:
    return OutputError(
        f"{path} is named like a part of this output but this run of bulkembed did not write "
        "it: move it away (bulkembed never deletes or overwrites a file it did not write)"
    )


def _damaged(path: AnyPath, why: str) -> OutputError:
    return OutputError(
        f"{path} is damaged ({why}): delete it to have its unit embedded again, or use --overwrite"
    )


class ParquetSink(Sink):
    """`OUT/<part>.parquet`, one file per committed part."""

    def __init__(self, directory: AnyPath) -> None:
        self.directory = directory
        # Temporary files carry their writer's own tag: a worker of a killed Ray run may
        # still be writing the unit that the rerun writes too.
        self._tag = f"{os.getpid()}-{secrets.token_hex(3)}"
        self.schema: pa.Schema | None = None
        self._options: dict[str, Any] = {}
        self._open: dict[str, pq.ParquetWriter] = {}
        self._spools: dict[str, Spool] = {}
        self._fence: Callable[[], None] = unfenced

    @property
    def description(self) -> str:
        return str(self.directory)

    def part_path(self, part: str) -> AnyPath:
        return part_path(self.directory, part)

    def _temporary(self, part: str) -> Path:
        """Where a part is written until it is committed: beside it, or a local spool file
        for an object."""
        path = self.part_path(part)
        if isinstance(path, ObjectPath):
            if part not in self._spools:
                self._spools[part] = Spool.for_target(path)
            return self._spools[part].local
        return path.with_name(f".{part}.{self._tag}{TEMPORARY_SUFFIX}")

    def _part_files(self) -> dict[str, AnyPath]:
        """The files named like parts, by part name."""
        if isinstance(self.directory, ObjectPath):
            found = [p for p, is_directory in self.directory.listing() if not is_directory]
            return {p.stem: p for p in found if p.suffix == ".parquet" and _PART.fullmatch(p.stem)}
        if not self.directory.is_dir():
            return {}
        files = self.directory.glob("part-*.parquet")
        return {p.stem: p for p in files if _PART.fullmatch(p.stem) and p.is_file()}

    def _temporaries(self) -> list[Path]:
        """Temporary parts beside the parts (none on object storage: they are spooled)."""
        if isinstance(self.directory, ObjectPath) or not self.directory.is_dir():
            return []
        return [p for p in self.directory.glob(".part-*") if _TEMPORARY.fullmatch(p.name)]

    def process_copies(self) -> Callable[[], ParquetSink]:
        """A sink of that process's own, whose temporary files carry its process's id, of
        the directory resolved here (the process may run in another working directory)."""
        return functools.partial(type(self), self.directory.resolve())

    def abandon(self, writers: Collection[int]) -> None:
        """Delete the temporary files that the processes `writers` (process ids) left: a
        device process that died while writing a part."""
        tags = tuple(f".{pid}-" for pid in writers)
        for path in self._temporaries():
            if any(tag in path.name for tag in tags):
                path.unlink(missing_ok=True)
        if isinstance(self.directory, ObjectPath):
            for pid in writers:
                Spool.remove_left_by(pid)

    def remove_unfinished(self, mine: Collection[str] | None) -> None:
        """Delete the temporary files of parts never committed (of the units in `mine`,
        when given: other runs write the rest)."""
        for temporary in self._temporaries():
            if mine is None or temporary.name[1:].split(".")[0] in mine:
                temporary.unlink(missing_ok=True)

    def check_foreign(self, overwrite: bool) -> None:
        """Parquet files that bulkembed did not write are refused even with `overwrite`:
        readers of the output would take them for parts. Any other file is refused unless
        `overwrite` (which leaves it where it is)."""
        if self.directory.exists() and not self.directory.is_dir():
            raise OutputError(f"--output {self.directory} is a file; pass a directory")
        if not self.directory.is_dir():
            return
        temporaries = set(self._temporaries())
        others = sorted(
            p for p in self.directory.iterdir() if p.name != RUN_DIRECTORY and p not in temporaries
        )
        labelled = {p for p in others if self._labelled(p)}
        for path in others:
            if path.suffix == ".parquet" and path not in labelled:
                if _PART.fullmatch(path.stem):
                    raise _not_ours(path)
                raise OutputError(
                    f"{self.directory} holds Parquet files that bulkembed did not write "
                    f"({path.name}): readers of the output would take them for parts; choose "
                    "another --output"
                )
        if others and not overwrite and len(labelled) == len(others):
            raise OutputError(
                f"{self.directory} holds parts of a bulkembed run whose "
                f"{RUN_DIRECTORY}/config.json is gone ({others[0].name}, ...): the settings "
                "they were embedded with are unknown; pass --overwrite to start over"
            )
        if others and not overwrite:
            names = [p.name for p in others]
            shown = ", ".join(names[:_SHOWN]) + (", ..." if len(names) > _SHOWN else "")
            raise OutputError(
                f"{self.directory} holds files that are not part of a bulkembed run here "
                f"({shown}): choose an empty directory, or pass --overwrite (it removes only "
                "bulkembed's own parts and run directory)"
            )

    @staticmethod
    def _labelled(path: AnyPath) -> bool:
        """Whether a file is a part that bulkembed wrote (for any run)."""
        if path.suffix != ".parquet" or not _PART.fullmatch(path.stem) or not path.is_file():
            return False
        try:
            return _label(path) is not None
        except _Unreadable:
            return False

    def remove(self, marked: Collection[str]) -> None:
        """Delete this output's parts: those the ledger names and those whose footer says
        bulkembed wrote them. A file named like a part that is neither is refused first,
        before anything is deleted."""
        ours = []
        for part, path in self._part_files().items():
            if part not in marked and not self._labelled(path):
                raise _not_ours(path)
            ours.append(path)
        for path in [*ours, *self._temporaries()]:
            path.unlink(missing_ok=True)

    def discard(self, parts: Collection[str]) -> None:
        for part in parts:
            self.part_path(part).unlink(missing_ok=True)

    def reconcile(
        self, done: dict[str, UnitRecord], run: str, mine: Collection[str] | None = None
    ) -> Recovered:
        recovered = Recovered()
        self.remove_unfinished(mine)
        if isinstance(self.directory, ObjectPath) and mine is None:
            # Uploads cut short by a crash: no object, but stored (and paid for) until
            # aborted. Shard runs leave them: the other shards' uploads are in flight.
            self.directory.abort_uploads(_PART_FILE)
            Spool.remove_orphans()
        files = self._part_files()
        lost = self._lost_units(done, files)
        recovered.lost = [p for p in lost if mine is None or p in mine]
        for part, path in files.items():
            if mine is not None and part not in mine:
                continue
            try:
                label = _label(path)
            except _Unreadable as e:
                if part in done:
                    raise _damaged(path, str(e)) from None
                raise OutputError(
                    f"{path} is not a readable Parquet file ({e}) and no done unit names "
                    "it: move it away to have its unit embedded again"
                ) from None
            if label is not None and label.get("run") != run:
                raise _not_ours(path)
            if part in done:
                if label is not None and label["rows"] != done[part].rows:
                    why = f"{label['rows']} rows where its unit has {done[part].rows}"
                    raise _damaged(path, why)
            elif label is None:
                raise _not_ours(path)
            elif label["unit"].get("bad") is None:
                raise OutputError(
                    f"{path} has no done-marker, and it had too many bad records to keep them "
                    "in its footer: delete it to have its unit embedded again"
                )
            else:
                recovered.adopted.append({**label["unit"], "rows": label["rows"]})
        return recovered

    def part_schema(self, part: str) -> pa.Schema:
        return parquet_file(self.part_path(part)).schema_arrow

    def lost_units(self, done: dict[str, UnitRecord]) -> list[str]:
        return self._lost_units(done, self._part_files())

    @staticmethod
    def _lost_units(done: dict[str, UnitRecord], files: dict[str, AnyPath]) -> list[str]:
        return [part for part, record in done.items() if record.rows and part not in files]

    def committed_ids(self, done: dict[str, UnitRecord]) -> Iterator[pa.Array]:
        for record in done.values():
            if record.rows:
                path = self.part_path(record.part)
                try:
                    with random_access(path) as source:
                        # A file's reader, not `read_table`: that imports pyarrow.dataset.
                        found = pq.ParquetFile(source, page_checksum_verification=True)
                        table = found.read(columns=["id"])
                except READ_ERRORS as e:
                    raise _damaged(path, str(e)) from e
                yield from table.column("id").chunks

    def start(self, schema: pa.Schema, fence: Callable[[], None] = unfenced) -> None:
        self.schema = schema
        self._options = writer_options(schema)
        self._fence = fence

    def write(self, part: str, batch: pa.RecordBatch) -> None:
        assert self.schema is not None
        try:
            writer = self._open.get(part)
            if writer is None:
                writer = pq.ParquetWriter(self._temporary(part), self.schema, **self._options)
                self._open[part] = writer
            writer.write_batch(batch)
        except OSError as e:
            raise OutputError(f"cannot write {self._temporary(part)}: {e}") from e

    def commit(self, part: str, label: dict[str, Any]) -> dict[str, Any]:
        writer = self._open.pop(part, None)
        if writer is None:
            return {}

        def close() -> None:
            writer.add_key_value_metadata({LABEL_KEY: json.dumps(label, default=str)})
            writer.close()

        self._publish(part, close)
        return {}

    def adopt(self, part: str, source: AnyPath, rows: int, label: dict[str, Any]) -> bool:
        """A copy of `source`, a local part written with this schema whose pages are intact,
        with `label` in its footer (`part_files.copy_with_entry`); not a part on object
        storage. A part with a damaged page is not copied: the writer then writes its rows
        one by one, and the read of them stops the run at the damage."""
        assert self.schema is not None
        if not isinstance(source, Path) or part in self._open:
            return False
        try:
            found = pq.ParquetFile(source)
            schema, found_rows = found.schema_arrow, found.metadata.num_rows
        except READ_ERRORS:
            return False
        if found_rows != rows or schema != self.schema or schema.metadata != self.schema.metadata:
            return False
        if not pages_intact(source):
            return False
        temporary = self._temporary(part)
        text = json.dumps(label, default=str)
        try:
            self._publish(part, lambda: copy_with_entry(source, temporary, LABEL_KEY, text))
        except FooterError:
            return False
        return True

    def _publish(self, part: str, write: Callable[[], None]) -> None:
        """Finish the temporary file of `part` with `write`, then, if this run still holds
        the output, put it in place: renamed (synced first), or uploaded. The temporary file
        goes on any error."""
        temporary = self._temporary(part)
        spool = self._spools.pop(part, None)
        try:
            write()
            self._fence()
            if spool is not None:
                spool.commit()
                return
            final = self.part_path(part)
            assert isinstance(final, Path)
            with open(temporary, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(temporary, final)
        except OSError as e:
            _drop(temporary, spool)
            raise OutputError(f"cannot commit {temporary}: {e}") from e
        except BaseException:
            _drop(temporary, spool)
            raise

    def close(self) -> None:
        """Drop every uncommitted part; errors closing them (a full disk) do not matter then."""
        for part, writer in list(self._open.items()):
            with contextlib.suppress(OSError):
                writer.close()
            spool = self._spools.pop(part, None)
            _drop(spool.local if spool is not None else self._temporary(part), spool)
        self._open.clear()
        for spool in self._spools.values():
            spool.discard()
        self._spools.clear()


def _drop(temporary: Path, spool: Spool | None) -> None:
    """Remove a part's temporary file (its spool, which lets go of its lock, on object
    storage)."""
    if spool is not None:
        spool.discard()
    else:
        temporary.unlink(missing_ok=True)

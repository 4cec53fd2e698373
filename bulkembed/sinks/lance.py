"""A LanceDB table (embedded, no server): `--output lancedb://PATH[?table=NAME]`, or on object
storage `lancedb+s3://BUCKET/PREFIX?table=NAME`.

The dense column is named `vector`, LanceDB's default search column. Any number of
processes may write units into the table at once (`--shard` runs, device processes, Ray
actors); each commits its own units.

Exactly once, by data files, intents and one commit per unit:

1. The writer of a unit writes its rows as Lance data files in the table's folder
   (`write_fragments`); no table version refers to them yet, so no reader sees them.
2. With the unit's last rows it writes the unit's intent to the run directory
   (`intents/<part>.json`: the names of those data files and the unit's label: run id,
   counts, bad records), then
3. appends the files to the table in one commit (`LanceOperation.Append`). Lance commits are
   optimistic: an append overtaken by another writer's commit is checked against it and
   committed on top, so units committed side by side all land, each whole, in one version.
   A commit that still conflicts is tried again, unless the files turn out to be in already.
4. The ledger marks the unit done.

A unit's rows are in the table exactly when its data files are in the latest version. On
restart a run reads the table's files, then the intents, and judges only its own units'
(a `--shard` run's; the other shards may be writing theirs):

- marked done: its files must be in the table; if they are not, its rows were removed,
  and the unit is forgotten and embedded again;
- not marked, files in the table (committed, then stopped before the marker): the marker
  is written from the intent's label; where the label cannot be used (another run's, or
  too many bad records to keep) the unit's fragments are deleted from the table instead
  (`LanceOperation.Delete`) and the unit is embedded again;
- not marked, files not in the table (never committed): its data files and intent are
  deleted, and the unit is embedded again.

A unit whose writer was lost (a device process, a Ray actor) is written again under the
same name by another; that writer finds the earlier intent: if its files are in the table
the unit is in already, and the new files are deleted; if not, the earlier files are. A
writer is replaced only once it is gone, so it cannot commit afterwards.

Data files written before their intent (a writer stopped mid-write) are referred to by
nothing and seen by no reader; `finish` deletes them. `finish` runs once every unit is done,
by one run at a time (`bulkembed.run_dir.intents.finishing`): it compacts the table, which
rewrites its files, so that from then on the table holds files that no intent names, and
the done units are checked by their row count instead.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Collection, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from bulkembed.errors import OutputError, UnaccountedRows
from bulkembed.sinks.base import IntentLog, Recovered, Sink, unfenced, unshown
from bulkembed.sinks.lance_index import (
    DEFAULT_TABLE,
    IndexSettings,
    build_indexes,
    fragment_files,
    fragment_ids,
    lance_modules,
    lance_storage_options,
    present_files,
    table_files,
    with_embedding_function,
)
from bulkembed.storage import AnyPath, ObjectPath, StorageOptions

if TYPE_CHECKING:
    from bulkembed.contracts import UnitRecord

# Rows of a unit wait in memory until they hold this many bytes or the unit ends: fewer,
# larger data files than one per chunk.
FLUSH_BYTES = 64 * 1024 * 1024
# Commits of one unit that conflict with other writers' before the run gives up (each is
# retried inside Lance too).
COMMIT_ATTEMPTS = 8


class LanceSink(Sink):
    """Rows committed, a unit at a time, to one table of a LanceDB database folder;
    `intents` is the run directory's intent log (see the module's docstring)."""

    def __init__(
        self,
        path: AnyPath,
        table: str = DEFAULT_TABLE,
        index: IndexSettings | None = None,
        fts_column: str | None = None,
        intents: IntentLog | None = None,
        storage_options: StorageOptions | None = None,
        text_column: str = "text",
    ) -> None:
        self.path = path
        self.table_name = table
        self.index = index
        self.fts_column = fts_column
        self.text_column = text_column
        self._intents = intents
        if storage_options is None and isinstance(path, ObjectPath):
            storage_options = path.options
        self.storage_options = storage_options
        self.schema: pa.Schema | None = None
        self._db: Any = None
        self._pending: list[pa.RecordBatch] = []
        self._pending_bytes = 0
        # Fragments written for the unit being written, not committed yet.
        self._fragments: list[Any] = []
        self._fence: Callable[[], None] = unfenced

    def __reduce__(self) -> tuple[Any, ...]:
        """A copy sent to another process (a device process, a Ray actor) connects anew."""
        arguments = (self.path, self.table_name, self.index, self.fts_column, self._intents)
        return (LanceSink, (*arguments, self.storage_options, self.text_column))

    @property
    def description(self) -> str:
        return f"table '{self.table_name}' of LanceDB {self.path}"

    @property
    def intents(self) -> IntentLog:
        if self._intents is None:
            raise OutputError(f"{self.description}: no run directory to keep intents in")
        return self._intents

    @property
    def _options(self) -> dict[str, str] | None:
        if self.storage_options is None or not isinstance(self.path, ObjectPath):
            return None
        return lance_storage_options(self.storage_options, self.path.scheme)

    @property
    def _uri(self) -> str:
        """The Lance dataset that holds the table."""
        return str(self.path / f"{self.table_name}.lance")

    @property
    def db(self) -> Any:
        if self._db is None:
            lancedb, _ = lance_modules()
            self._db = lancedb.connect(str(self.path), storage_options=self._options)
        return self._db

    def _existing_table(self) -> Any:
        if not self.path.is_dir():
            return None
        try:
            return self.db.open_table(self.table_name)
        except ValueError:
            return None

    def dataset(self, version: int | None = None) -> Any:
        """The table at `version` (the latest: None), as a Lance dataset."""
        _, lance = lance_modules()
        return lance.dataset(self._uri, version=version, storage_options=self._options)

    def part_schema(self, part: str) -> pa.Schema:
        """The table's schema: every part's."""
        return self.dataset().schema

    def _remove_files(self, names: Collection[str]) -> None:
        """Delete data files that no table version refers to."""
        for name in names:
            (self.path / f"{self.table_name}.lance" / "data" / name).unlink(missing_ok=True)

    def check_foreign(self, overwrite: bool) -> None:
        if self.path.exists() and not self.path.is_dir():
            raise OutputError(f"{self.path} is a file; LanceDB needs a directory")
        if self._existing_table() is not None:
            raise OutputError(
                f"{self.path} holds a table '{self.table_name}' that bulkembed did not write "
                "(--overwrite does not remove it): choose another table name"
            )

    def remove(self, marked: Collection[str]) -> None:
        """Drop the table: the run directory beside it shows that bulkembed made it."""
        if self.path.is_dir():
            self.db.drop_table(self.table_name, ignore_missing=True)
        self.intents.remove()

    def reconcile(
        self, done: dict[str, UnitRecord], run: str, mine: Collection[str] | None = None
    ) -> Recovered:
        recovered = Recovered()
        self.intents.remove_temporaries(mine)
        if self._existing_table() is None:
            if sum(r.rows for r in done.values()):
                raise OutputError(
                    f"{self.description} is missing but units are marked done: restore it, "
                    "or use --overwrite"
                )
            for part in self.intents.all():
                if mine is None or part in mine:
                    self.intents.forget(part)
            return recovered
        # The table first, then the intents: every file in this version was committed after
        # its intent was written, so a file that no intent names was not committed by a unit.
        dataset = self.dataset()
        fragments = table_files(dataset)
        present = frozenset().union(*fragments.values())
        intents = self.intents.all()
        named = frozenset().union(*(i["files"] for i in intents.values()))
        ours = {p: i for p, i in intents.items() if mine is None or p in mine}
        if not present <= named:
            # Compacted by `finish`: every unit was done then.
            unmarked = {p: i for p, i in ours.items() if p not in done}
            rows = sum(r.rows for r in done.values())
            rows += sum(i["label"]["unit"]["rows"] for i in unmarked.values())
            found = dataset.count_rows()
            labels = [self._label(i, run) for i in unmarked.values()]
            if found != rows or None in labels:
                raise self._unaccounted(found, rows)
            recovered.adopted = [{**label, "version": dataset.version} for label in labels if label]
            return recovered
        taken_back: list[int] = []
        forgotten = []
        for part, intent in ours.items():
            files = frozenset(intent["files"])
            if part in done:
                if not files <= present:
                    recovered.lost.append(part)
                continue
            label = self._label(intent, run)
            if files <= present and label is not None:
                recovered.adopted.append({**label, "version": dataset.version})
            elif files & present:
                taken_back += [i for i, f in fragments.items() if f & files]
                forgotten.append(part)
            else:
                self._remove_files(files)
                self.intents.forget(part)
        # The fragments leave the table before their intents go: a crash in between leaves
        # intents that name no file of the table, which the next restart forgets.
        if taken_back:
            self._delete_fragments(taken_back)
        for part in forgotten:
            self.intents.forget(part)
        return recovered

    @staticmethod
    def _label(intent: dict[str, Any], run: str) -> dict[str, Any] | None:
        """A unit's marker, from the label of its intent, when this run wrote it and it
        kept the unit's bad records."""
        label = intent["label"]
        if label.get("run") != run or label["unit"].get("bad") is None:
            return None
        return dict(label["unit"])

    def _delete_fragments(self, ids: list[int]) -> None:
        """Take committed fragments back out of the table."""
        _, lance = lance_modules()
        delete = lance.LanceOperation.Delete([], ids, "false")
        self._commit(
            delete, lambda dataset: not {f.fragment_id for f in dataset.get_fragments()} & set(ids)
        )

    def _commit(self, operation: Any, landed: Any) -> int:
        """Commit `operation` on the latest version; on a conflict, look whether it
        `landed(dataset)` after all, else try again. Returns the version it made."""
        _, lance = lance_modules()
        from lance.commit import CommitConflictError

        dataset = self.dataset()
        for _ in range(COMMIT_ATTEMPTS):
            try:
                committed = lance.LanceDataset.commit(
                    self._uri,
                    operation,
                    read_version=dataset.version,
                    storage_options=self._options,
                )
                return int(committed.version)
            except CommitConflictError as e:
                if not e.retryable:
                    raise OutputError(f"cannot commit to {self.description}: {e}") from e
            except OSError as e:
                raise OutputError(f"cannot commit to {self.description}: {e}") from e
            dataset = self.dataset()
            if landed(dataset):
                return int(dataset.version)
        raise OutputError(
            f"cannot commit to {self.description}: other writers' commits kept conflicting"
        )

    def _unaccounted(self, found: int, rows: int) -> UnaccountedRows:
        return UnaccountedRows(
            f"{self.description} holds {found} rows where its done units hold {rows}, and "
            "its files are not those its units committed: its ledger was damaged (lost "
            "done-markers and intents) or the table was changed outside bulkembed; use "
            "--overwrite"
        )

    def committed_ids(self, done: dict[str, UnitRecord]) -> Iterator[pa.Array]:
        """The ids in the table, but for the fragments of units not in `done` (another
        shard's, or one being written). An id may come twice when another run compacted
        the table while it was read."""
        if self._existing_table() is None:
            return
        others = frozenset().union(
            *(i["files"] for p, i in self.intents.all().items() if p not in done)
        )
        yield from fragment_ids(self.dataset, others, self.description)

    def start(self, schema: pa.Schema, fence: Callable[[], None] = unfenced) -> None:
        named = pa.schema([f.with_name("vector") if f.name == "dense" else f for f in schema])
        self.schema = with_embedding_function(
            named.with_metadata(schema.metadata), self.text_column
        )
        self._fence = fence
        table = self._existing_table()
        if table is None:
            self.path.mkdir(parents=True, exist_ok=True)
            # Writers of other shards may create it at the same moment.
            table = self.db.create_table(self.table_name, schema=self.schema, exist_ok=True)
        if table.schema != self.schema:
            raise OutputError(
                f"{self.description} has columns {table.schema.names}, not the "
                f"{self.schema.names} this run writes: use --overwrite"
            )

    def write(self, part: str, batch: pa.RecordBatch) -> None:
        assert self.schema is not None
        self._pending.append(batch.rename_columns(self.schema.names))
        self._pending_bytes += batch.nbytes
        if self._pending_bytes >= FLUSH_BYTES:
            self._flush()

    def _flush(self) -> None:
        """Write the pending rows as data files that no table version refers to yet."""
        if not self._pending:
            return
        from lance.fragment import write_fragments

        rows = pa.Table.from_batches(self._pending, schema=self.schema)
        self._pending, self._pending_bytes = [], 0
        try:
            fragments = write_fragments(
                rows, self._uri, schema=self.schema, storage_options=self._options
            )
        except OSError as e:
            raise OutputError(f"cannot write to {self.description}: {e}") from e
        self._fragments += fragments

    def commit(self, part: str, label: dict[str, Any]) -> dict[str, Any]:
        self._flush()
        fragments, self._fragments = self._fragments, []
        if not fragments:
            return {}
        files = frozenset().union(*map(fragment_files, fragments))
        try:
            # Writing the rows took a while: is the output still this run's?
            self._fence()
        except BaseException:
            self._fragments = fragments  # `close` removes their files
            raise
        earlier = self.intents.read(part)
        if earlier is not None:
            # Another writer of this unit was lost: after its commit, or before.
            dataset = self.dataset()
            if frozenset(earlier["files"]) <= present_files(dataset):
                self._remove_files(files)
                return {"version": int(dataset.version)}
            self._remove_files(earlier["files"])
        # The rows' counts stay out: a table is carried from by its rows, not its parts.
        unit_label = {k: v for k, v in label.items() if k != "counts"}
        self.intents.write(part, {"files": sorted(files), "label": unit_label})
        return {"version": self._append(fragments, files)}

    def _append(self, fragments: list[Any], files: frozenset[str]) -> int:
        """Commit the unit's fragments: the version that holds them."""
        _, lance = lance_modules()

        def landed(dataset: Any) -> bool:
            return files <= present_files(dataset)

        return self._commit(lance.LanceOperation.Append(fragments), landed)

    def finish(self, phase: Callable[[str], None] = unshown) -> None:
        """Compact the table, delete the data files that no version refers to (every unit
        is done: no writer is left), then build the indexes, each step named to `phase`."""
        table = self.db.open_table(self.table_name)
        phase(f"compacting {self.description}")
        with warnings.catch_warnings():
            # It warns that readers of old versions would fail: the run's versions are not
            # needed once it is done.
            warnings.simplefilter("ignore", UserWarning)
            table.optimize(cleanup_older_than=timedelta(0), delete_unverified=True)
        build_indexes(table, self.index, self.fts_column, phase)

    def close(self) -> None:
        """Forget rows not written, and delete the data files of a unit not committed."""
        self._pending, self._pending_bytes = [], 0
        fragments, self._fragments = self._fragments, []
        # A failure here leaves the files to `finish`.
        with contextlib.suppress(OSError):
            self._remove_files(frozenset().union(*map(fragment_files, fragments)))

"""A LanceDB table (embedded, no server): `--output lancedb://PATH[?table=NAME]`.

Rows are appended as they come, a unit's rows in one or a few `add` calls; the dense column
is named `vector`, LanceDB's default search column.

Exactly once, by table versions. Every `add` commits one new table version, atomically, and
versions form a single line. A unit is committed by appending its last rows; the table's
version right after that is kept in the unit's done-marker. Units are committed one after
the other by one writer (the run directory's lock keeps out any other), so the version in
the latest marker holds the rows of the done units and nothing else. On restart the table
is restored to that version when it has moved past it, which takes back every row of a unit
that was being written when the run stopped; that unit is then written again whole. With no
unit done the table is dropped and made anew. Nothing else may write to the table while a
run is unfinished.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import warnings
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from bulkembed.errors import OutputError
from bulkembed.sinks.base import Recovered, Sink

if TYPE_CHECKING:
    from bulkembed.contracts import UnitRecord

DEFAULT_TABLE = "embeddings"
# Rows of a unit wait in memory until they hold this many bytes or the unit ends: fewer,
# larger fragments than one `add` per chunk.
FLUSH_BYTES = 64 * 1024 * 1024
# The version of a newly created table.
_FIRST_VERSION = 1
# IVF trains each partition on up to this many rows.
ROWS_PER_PARTITION = 256
# From this many rows `auto` takes IVF_PQ (compressed); below, IVF_HNSW_SQ.
PQ_FROM_ROWS = 1_000_000
# IVF_HNSW_SQ: one partition (one graph) per this many rows.
ROWS_PER_HNSW_PARTITION = 1_000_000


@dataclass(frozen=True, slots=True)
class IndexSettings:
    """`--index`: vector indexes to build once every unit is in."""

    kind: str = "auto"
    partitions: int | None = None
    metric: str = "cosine"

    def choose(self, rows: int) -> tuple[str, int]:
        """The index type and number of IVF partitions for a table of `rows` rows."""
        kind = self.kind
        if kind == "auto":
            kind = "ivf_pq" if rows >= PQ_FROM_ROWS else "ivf_hnsw_sq"
        if self.partitions is not None:
            return kind, self.partitions
        trainable = max(1, rows // ROWS_PER_PARTITION)
        if kind == "ivf_hnsw_sq":
            return kind, min(trainable, max(1, rows // ROWS_PER_HNSW_PARTITION))
        return kind, min(trainable, max(1, round(math.sqrt(rows))))


def _version(record: UnitRecord) -> int:
    assert record.version is not None
    return record.version


def _lancedb() -> Any:
    try:
        import lancedb
    except ImportError:
        raise OutputError(
            "LanceDB output needs the lance extra: pip install 'bulkembed[lance]'"
        ) from None
    return lancedb


def _index_config(kind: str, partitions: int, metric: str) -> Any:
    from lancedb.index import HnswSq, IvfFlat, IvfPq

    config = {"ivf_pq": IvfPq, "ivf_hnsw_sq": HnswSq, "ivf_flat": IvfFlat}[kind]
    return config(distance_type=metric, num_partitions=partitions)


class LanceSink(Sink):
    """Rows appended to one table of a LanceDB database folder."""

    def __init__(
        self,
        path: Path,
        table: str = DEFAULT_TABLE,
        index: IndexSettings | None = None,
        fts_column: str | None = None,
    ) -> None:
        self.path = path
        self.table_name = table
        self.index = index
        self.fts_column = fts_column
        self.schema: pa.Schema | None = None
        self._db: Any = None
        self._table: Any = None
        self._pending: list[pa.RecordBatch] = []
        self._pending_bytes = 0
        self._committed_version: int | None = None

    @property
    def description(self) -> str:
        return f"table '{self.table_name}' of LanceDB {self.path}"

    @property
    def db(self) -> Any:
        if self._db is None:
            self._db = _lancedb().connect(str(self.path))
        return self._db

    def _existing_table(self) -> Any:
        try:
            return self.db.open_table(self.table_name)
        except ValueError:
            return None

    def check_foreign(self, overwrite: bool) -> None:
        if self.path.exists() and not self.path.is_dir():
            raise OutputError(f"{self.path} is a file; LanceDB needs a directory")
        if self.path.is_dir() and self._existing_table() is not None:
            raise OutputError(
                f"{self.path} holds a table '{self.table_name}' that bulkembed did not write "
                "(--overwrite does not remove it): choose another table name"
            )

    def remove(self, marked: Collection[str]) -> None:
        """Drop the table: the run directory beside it shows that bulkembed made it."""
        if self.path.is_dir():
            self.db.drop_table(self.table_name, ignore_missing=True)

    def reconcile(
        self, done: dict[str, UnitRecord], run: str, mine: Collection[str] | None = None
    ) -> Recovered:
        recovered = Recovered()
        table = self._existing_table() if self.path.is_dir() else None
        # In commit order: by version, and a unit that added rows before the empty units
        # that share its version.
        marked = sorted(
            (r for r in done.values() if r.version is not None),
            key=lambda r: (_version(r), r.rows == 0),
        )
        rows = sum(r.rows for r in marked)
        if table is None:
            if rows:
                raise OutputError(
                    f"{self.description} is missing but units are marked done: restore it, "
                    "or use --overwrite"
                )
            return recovered
        versions = {v["version"] for v in table.list_versions()}
        if not marked:
            # Rows of a unit cut short, unless the history was compacted (only a finished
            # table's is): then they are rows that the ledger lost.
            if table.count_rows() and _FIRST_VERSION not in versions:
                raise self._unaccounted(table.count_rows(), 0)
            self.db.drop_table(self.table_name)
            return recovered
        committed = _version(marked[-1])
        if table.version < committed:
            raise OutputError(
                f"{self.description} is at version {table.version}, older than its last "
                f"committed unit's ({committed}): it was replaced; use --overwrite"
            )
        if any(_version(r) not in versions for r in marked):
            # `finish` compacted the table and removed its old versions; it happens only
            # once every unit is in, so the table must hold exactly the done units' rows.
            if table.count_rows() != rows:
                raise self._unaccounted(table.count_rows(), rows)
        else:
            kept = self._consistent_units(table, marked)
            recovered.lost = [r.part for r in marked[kept:]]
            if kept == 0:
                self.db.drop_table(self.table_name)
                return recovered
            if table.version > _version(marked[kept - 1]):
                table.restore(_version(marked[kept - 1]))
        self._table = table
        self._committed_version = table.version
        return recovered

    @staticmethod
    def _consistent_units(table: Any, marked: list[UnitRecord]) -> int:
        """How many of the done units (by version) the table's history accounts for: the
        rows at the version of each must be those of it and the units before it. A lost
        marker shows as more rows than that from its unit on; the first such unit is found
        by bisection (a version checked out per step)."""
        totals = list(itertools.accumulate(r.rows for r in marked))

        def holds(i: int) -> bool:
            table.checkout(_version(marked[i]))
            return table.count_rows() == totals[i]

        low, high = 0, len(marked) - 1
        try:
            if holds(high):
                return len(marked)
            while low < high:
                middle = (low + high) // 2
                if holds(middle):
                    low = middle + 1
                else:
                    high = middle
        finally:
            table.checkout_latest()
        return low

    def _unaccounted(self, found: int, rows: int) -> OutputError:
        return OutputError(
            f"{self.description} holds {found} rows where its done units hold {rows}, and "
            "its history was compacted: its ledger was damaged (a lost done-marker) or the "
            "table was changed outside bulkembed; use --overwrite"
        )

    def committed_ids(self, done: dict[str, UnitRecord]) -> Iterator[Any]:
        if self._table is None:
            return
        for batch in self._table.search().select(["id"]).to_batches():
            yield from batch.column("id").to_pylist()

    def start(self, schema: pa.Schema) -> None:
        self.schema = pa.schema([f.with_name("vector") if f.name == "dense" else f for f in schema])
        if self._table is None:
            self.path.mkdir(parents=True, exist_ok=True)
            self._table = self.db.create_table(self.table_name, schema=self.schema)
            self._committed_version = self._table.version
        elif self._table.schema != self.schema:
            raise OutputError(
                f"{self.description} has columns {self._table.schema.names}, not the "
                f"{self.schema.names} this run writes: use --overwrite"
            )

    def write(self, part: str, batch: pa.RecordBatch) -> None:
        assert self.schema is not None
        self._pending.append(batch.rename_columns(self.schema.names))
        self._pending_bytes += batch.nbytes
        if self._pending_bytes >= FLUSH_BYTES:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        rows = pa.Table.from_batches(self._pending, schema=self.schema)
        self._pending, self._pending_bytes = [], 0
        try:
            self._table.add(rows)
        except OSError as e:
            raise OutputError(f"cannot write to {self.description}: {e}") from e

    def commit(self, part: str, label: dict[str, Any]) -> dict[str, Any]:
        self._flush()
        self._committed_version = self._table.version
        return {"version": self._committed_version}

    def finish(self) -> None:
        table = self._table
        # From here on every unit is in: nothing is to be taken back, even if finishing fails.
        self._committed_version = None
        with warnings.catch_warnings():
            # It warns that other readers of old versions would fail: the lock keeps out
            # other writers, and the run's own versions are not needed once it is done.
            warnings.simplefilter("ignore", UserWarning)
            table.optimize(cleanup_older_than=timedelta(0))
        rows = table.count_rows()
        if self.index is not None and rows:
            assert self.schema is not None
            kind, partitions = self.index.choose(rows)
            for column, metric in (("vector", self.index.metric), ("multivector", "cosine")):
                if column in self.schema.names:
                    config = _index_config(kind, partitions, metric)
                    table.create_index(column, config=config)
        if self.fts_column is not None:
            from lancedb.index import FTS

            table.create_index(self.fts_column, config=FTS(), replace=True)

    def close(self) -> None:
        """Forget rows not flushed, and take back those flushed for an unfinished unit."""
        self._pending, self._pending_bytes = [], 0
        table = self._table
        if table is not None and self._committed_version is not None:
            # A failure here leaves the rows to the next run's `reconcile`.
            with contextlib.suppress(OSError, RuntimeError, ValueError):
                if table.version > self._committed_version:
                    table.restore(self._committed_version)

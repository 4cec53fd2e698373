"""Rows merged into a LanceDB table in place, by id: the sink of `--since` naming the
`--output` table.

A unit's new and changed rows are merged into the table in one commit (`merge_insert` on
`id`: a row whose id is there replaces it, one whose id is not is added); rows carried over
are not written at all, so the table keeps them as they are. Merging the same rows again
leaves the table as it was, so a unit merged, then embedded again after a crash before its
done-marker, cannot leave an id twice. Ids gone from the input are deleted at the end
(`delete_ids`), which is as safe to repeat.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa

from bulkembed.errors import OutputError
from bulkembed.sinks.base import InPlaceSync, Sink, unfenced
from bulkembed.sinks.lance import LanceSink
from bulkembed.sinks.parquet import ParquetSink
from bulkembed.storage import AnyPath, StorageOptions

# Ids per delete commit: one SQL filter of this many literals.
DELETE_BATCH = 1000


# The table's name for the output contract's `dense` column (what LanceDB searches).
_STORED = {"dense": "vector"}
_CONTRACT = {stored: name for name, stored in _STORED.items()}


class LanceRows:
    """A Lance dataset's rows in the output contract's column names (`OutputRows`)."""

    def __init__(self, dataset: Any) -> None:
        self._dataset = dataset

    @property
    def names(self) -> list[str]:
        return [_CONTRACT.get(name, name) for name in self._dataset.schema.names]

    def id_field(self) -> pa.Field:
        return self._dataset.schema.field("id")

    def read(self, columns: list[str]) -> pa.Table:
        return self._named(self._dataset.to_table(columns=self._stored(columns)))

    def take(self, offsets: list[int], columns: list[str]) -> pa.Table:
        return self._named(self._dataset.take(offsets, columns=self._stored(columns)))

    @staticmethod
    def _stored(columns: list[str]) -> list[str]:
        return [_STORED.get(name, name) for name in columns]

    @staticmethod
    def _named(table: pa.Table) -> pa.Table:
        return table.rename_columns([_CONTRACT.get(n, n) for n in table.column_names])


def _literal(value: Any) -> str:
    """An id as a SQL literal of LanceDB's filters."""
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return str(int(value))


class TableMerge(Sink):
    """Each committed unit's rows merged by id into table `table` of LanceDB `path`."""

    def __init__(
        self, path: AnyPath, table: str, storage_options: StorageOptions | None = None
    ) -> None:
        self.lance = LanceSink(path, table, storage_options=storage_options)
        self.schema: pa.Schema | None = None
        self._pending: list[pa.RecordBatch] = []
        self._fence: Callable[[], None] = unfenced

    def __reduce__(self) -> tuple[Any, ...]:
        """A copy sent to a device process connects anew."""
        lance = self.lance
        return (TableMerge, (lance.path, lance.table_name, lance.storage_options))

    @property
    def description(self) -> str:
        return self.lance.description

    def start(self, schema: pa.Schema, fence: Callable[[], None] = unfenced) -> None:
        self.schema = pa.schema([f.with_name("vector") if f.name == "dense" else f for f in schema])
        self._fence = fence

    def _check(self, table: Any) -> None:
        """Refuse rows the table cannot take (checked once there are rows to merge)."""
        assert self.schema is not None
        if table.schema == self.schema:
            return
        if table.schema.names != self.schema.names:
            why = f"has columns {table.schema.names}, not the {self.schema.names}"
        else:
            name = next(f.name for f, g in zip(table.schema, self.schema, strict=True) if f != g)
            found, written = table.schema.field(name).type, self.schema.field(name).type
            why = f"holds {name} as {found}, not as the {written}"
        raise OutputError(f"{self.description} {why} this run writes: run without --since")

    def write(self, part: str, batch: pa.RecordBatch) -> None:
        assert self.schema is not None
        self._pending.append(batch.rename_columns(self.schema.names))

    def commit(self, part: str, label: dict[str, Any]) -> dict[str, Any]:
        rows, self._pending = self._pending, []
        if not rows:
            return {}
        table = self.lance.db.open_table(self.lance.table_name)
        self._check(table)
        self._fence()
        try:
            (
                table.merge_insert("id")
                .when_matched_update_all()
                .when_not_matched_insert_all()
                .execute(pa.Table.from_batches(rows, schema=self.schema))
            )
        except OSError as e:
            raise OutputError(f"cannot merge into {self.description}: {e}") from e
        return {}

    def close(self) -> None:
        self._pending = []


def delete_ids(sink: LanceSink, ids: Iterable[Any]) -> int:
    """Delete the rows of `ids` from the table, `DELETE_BATCH` ids a commit; return how many
    ids were named. Ids that are gone already are no matter: a repeat deletes nothing."""
    table = sink.db.open_table(sink.table_name)
    batch: list[Any] = []
    count = 0
    for value in ids:
        batch.append(value)
        if len(batch) == DELETE_BATCH:
            table.delete(f"id IN ({', '.join(map(_literal, batch))})")
            count, batch = count + len(batch), []
    if batch:
        table.delete(f"id IN ({', '.join(map(_literal, batch))})")
        count += len(batch)
    return count


class IdParts(ParquetSink):
    """Parquet parts that keep only the `id` column: what an in-place sync keeps of each
    unit in its run directory, so that the input's ids are known at the end."""

    def start(self, schema: pa.Schema, fence: Callable[[], None] = unfenced) -> None:
        super().start(pa.schema([schema.field("id")]), fence)

    def write(self, part: str, batch: pa.RecordBatch) -> None:
        super().write(part, batch.select(["id"]))


class TableInPlace(InPlaceSync):
    """A LanceDB table, to be synced in place."""

    def __init__(self, table: LanceSink) -> None:
        self.table = table

    def version(self) -> int:
        return int(self.table.dataset().version)

    def rows(self, version: int | None = None) -> LanceRows:
        return LanceRows(self.table.dataset(version))

    def merging(self) -> functools.partial[TableMerge]:
        table = self.table
        return functools.partial(TableMerge, table.path, table.table_name, table.storage_options)

    def delete(self, ids: Iterable[Any]) -> int:
        return delete_ids(self.table, ids)

    def id_parts(self, directory: AnyPath) -> IdParts:
        return IdParts(directory)

    def finish(self, phase: Callable[[str], None]) -> None:
        self.table.finish(phase)


def in_place(sink: Sink) -> TableInPlace:
    """What an in-place sync needs of a LanceDB table's sink."""
    assert isinstance(sink, LanceSink)
    return TableInPlace(sink)

"""The upserts of a `--since` run: each unit's embedded rows (new and changed, not carried
over) written to a second sink as well (a change set's `upserts/`, or the LanceDB table a
sync merges them into), committed just before the unit's part, so that a unit is marked
done only once both are in place. A mode says what makes that sink (`RunMode.upserts`);
each writing process makes its own and a part writer around it (`part_writer`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from bulkembed.engine.writer import Committed, Label, PartWriter

if TYPE_CHECKING:
    import pyarrow as pa

    from bulkembed.contracts import RowCounts, UnitRecord
    from bulkembed.sinks import Sink

# What makes a writing process's sink of upserts (None: the mode writes none). It is
# pickled into device processes and Ray actors, so a module-level function or a sink's.
UpsertSinks = Callable[[], "Sink | None"]


def no_upserts() -> Sink | None:
    """The sink of upserts of a mode that writes none."""
    return None


def part_writer(
    upserts: UpsertSinks,
    run_id: str,
    sink: Sink,
    schema: pa.Schema,
    committed: Committed,
    fence: Callable[[], None],
) -> PartWriter:
    """A writing process's part writer: one that tees the embedded rows to a sink of
    upserts, where `upserts` makes one."""
    teed = upserts()
    if teed is None:
        return PartWriter(run_id, sink, schema, committed, fence)
    return UpsertingWriter(teed, run_id, sink, schema, committed, fence)


class UpsertingWriter(PartWriter):
    """A part writer that writes each unit's embedded rows to `upserts` too, and commits
    them just before the unit's part."""

    def __init__(
        self,
        upserts: Sink,
        run_id: str,
        sink: Sink,
        schema: pa.Schema,
        committed: Committed,
        fence: Callable[[], None],
    ) -> None:
        self.upserts = upserts
        upserts.start(schema, fence)
        super().__init__(run_id, sink, schema, committed, fence)

    def embedded(self, part: str, batch: pa.RecordBatch) -> None:
        self.upserts.write(part, batch)

    def commit(self, record: UnitRecord, bad: list[dict[str, Any]], counts: RowCounts) -> None:
        # The upserts hold the unit's embedded rows only: the rows' counts are the part's.
        label: Label = self.label(record, bad, counts)
        self.upserts.commit(record.part, {k: v for k, v in label.items() if k != "counts"})
        super().commit(record, bad, counts)

    def close(self) -> None:
        super().close()
        self.upserts.close()

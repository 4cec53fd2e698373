"""A `--since` run into a new output: unchanged rows carried over from the previous output,
and, where the output's kind keeps one (`capabilities.change_set`), a change set beside it:
each unit's new and changed rows written a second time (the upserts), and once every unit
is done the deletes (`bulkembed.engine.modes.incremental`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pyarrow as pa

from bulkembed.engine.modes.base import OpenedRun, own_output
from bulkembed.engine.modes.incremental import Incremental, share_quantization
from bulkembed.errors import OutputError
from bulkembed.incremental.deletions import missing_ids
from bulkembed.incremental.previous import PreviousOutput
from bulkembed.schema import CONTENT_HASH, EMBEDDING_COLUMNS
from bulkembed.sinks import ChangeSet, change_set_of
from bulkembed.storage import location
from bulkembed.wording import counted

if TYPE_CHECKING:
    from bulkembed.contracts import UnitRecord
    from bulkembed.engine.plan import RunPlan
    from bulkembed.reporting.progress import Reporter


class ChangeSetRun(Incremental):
    """A `--since` run whose output is not the previous one."""

    @contextlib.contextmanager
    def open(self, plan: RunPlan, reporter: Reporter) -> Iterator[OpenedRun]:
        with own_output(plan) as (run, sink):
            self.change_set: ChangeSet | None = change_set_of(plan.target, run.meta)
            with self.opened(plan, run, sink, reporter) as opened:
                yield opened

    def prepare(self, complete: bool) -> None:
        """Read the previous output while input units are pending: to carry rows over, and
        for the change set's end step."""
        if complete:
            return
        plan = self.plan
        since = location(plan.config.run.since or "", plan.storage_options)
        self.previous = PreviousOutput(since, self.settings, plan.id_key)
        if (change_set := self.change_set) is not None:
            change_set.open(plan.my_units)
            self._upserts = change_set.upserts
            self.previous.carrier.keeps_unread = plan.config.inputs.limit is None
        self.previous_rows = self.previous.rows
        share_quantization(plan, self.run, self.previous)

    def end(self, phase: Callable[[str], None]) -> Callable[[], None] | None:
        """The change set's deletes and the kept rows (None without a change set, or with
        `--limit`)."""
        if (
            self.plan.config.inputs.limit is not None
            or not self.plan.target.capabilities.change_set
        ):
            return None
        return self._end

    def _end(self) -> None:
        """The deletes of the change set, and the rows kept in the new output."""
        change_set = self.change_set
        assert change_set is not None and self.previous is not None
        inputs, unread, over = self.start_end()
        ids = self.sink.committed_ids(inputs)
        missing = list(missing_ids(self.previous, ids, unread, self.plan.id_key))
        deletions = self.decide(missing, over)
        if self.previous.other_weights and (deletions.kept or deletions.withheld):
            raise OutputError(
                f"--since {self.previous.path} was made with other weights, and "
                f"{counted(deletions.kept + deletions.withheld, 'row')} of it would stay in "
                "this output as it is (a record that could not be read, or a delete "
                "--max-deletes held), with a vector of those weights; read every input whole "
                "and allow the deletes, then run again (or run without --since)"
            )
        self.note(deletions)
        if deletions.kept or deletions.withheld:
            schema = self._part_schema(inputs)
            self.keep(missing, deletions, schema, self.previous.rows_at)
        gone = [m.ids.filter(pa.array(m.gone)) for m in missing if deletions.deleted]
        kind = missing[0].ids.type if missing else self.plan.reader.id_type or pa.string()
        change_set.write_deletes(pa.chunked_array([c for g in gone for c in g.chunks], kind))

    def _part_schema(self, inputs: dict[str, UnitRecord]) -> pa.Schema:
        """The schema of the output's parts: an input part's, or, with none (no input
        unit has a row), the previous output's with this run's passthrough columns."""
        assert self.previous is not None
        for part, record in inputs.items():
            schema = self.sink.part_schema(part) if record.rows else None
            if schema is not None:
                return schema
        first = self.previous.parts.schema()
        fields = [f for f in first if f.name in ("id", *EMBEDDING_COLUMNS, CONTENT_HASH)]
        types = self.plan.reader.column_types
        fields += [pa.field(name, kind) for name, kind in types.items()]
        return pa.schema(fields, metadata=first.metadata)

"""A `--since` run that syncs the `--output` LanceDB table in place (`bulkembed.engine.sync`):
the table's run directory locked for the whole sync, the sync's own run directory and
sink of id parts, each unit's new and changed rows merged into the table (the upserts),
and once every unit is done the deletes applied to the table and the table finished
(`bulkembed.engine.modes.incremental`). The previous content is the table at the version it
had when the sync began, kept in the mode's file and read again on resume, so that a
resumed sync classifies every document as the first attempt did; once the end step has
begun, that version is not read again (the compaction may have removed it)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from bulkembed.engine.modes.base import OpenedRun
from bulkembed.engine.modes.incremental import Incremental, share_quantization
from bulkembed.engine.sync import TableSync
from bulkembed.incremental.deletions import missing_ids
from bulkembed.run_dir import fingerprint

if TYPE_CHECKING:
    from bulkembed.engine.plan import RunPlan
    from bulkembed.reporting.progress import Reporter
    from bulkembed.reporting.summary import Summary


class InPlaceSync(Incremental):
    """A `--since` run naming its own `--output` table."""

    sync: TableSync

    @contextlib.contextmanager
    def open(self, plan: RunPlan, reporter: Reporter) -> Iterator[OpenedRun]:
        self.sync = sync = TableSync(plan, fingerprint(plan.config, plan.spec, list(plan.files)))
        sync.lock()
        try:
            staged, run, sink = sync.staging(plan)

            def begun(before: dict[str, Any]) -> None:
                if sync.version is None:
                    sync.version = before.get("previous_version")

            with self.opened(staged, run, sink, reporter, begun) as opened:
                yield opened
        finally:
            sync.unlock()

    def prepare(self, complete: bool) -> None:
        """Read the table as it was when the sync began, until its end step started."""
        self._upserts = self.sync.upserts()
        if complete or self.ended:
            return
        self.previous = self.sync.previous(self.plan.id_key)
        self.previous.carrier.keeps_unread = True
        self.previous_rows = self.previous.rows
        share_quantization(self.plan, self.run, self.previous)

    def state(self) -> dict[str, Any]:
        return {**super().state(), "previous_version": self.sync.version}

    def end(self, phase: Callable[[str], None]) -> Callable[[], None] | None:
        if self.plan.config.inputs.limit is not None:
            return None
        return lambda: self._end(phase)

    def finish(self, summary: Summary) -> None:
        """The summary goes to the table's run directory too."""
        self.sync.table_run.write_summary(summary.as_dict())

    def _end(self, phase: Callable[[str], None]) -> None:
        """Delete the ids gone from the table, keep the others in the sync's ledger, and
        finish the table. The table now holds the previous version's ids and the merged
        ones: what it holds beyond the input units' ids is what the previous version held
        beyond them."""
        inputs, unread, over = self.start_end()
        current = self.sync.current()
        held = self.sink.committed_ids(inputs)
        missing = list(missing_ids(current, held, unread, self.plan.id_key))
        deletions = self.deletions
        if deletions is None or not deletions.deleted:
            # Deletes once begun are finished with the decision that began them.
            deletions = self.decide(missing, over)
            self.note(deletions)
        if deletions.deleted:
            self.run.lock.check()
            self.sync.delete([m.ids.filter(pa.array(m.gone)) for m in missing])
        if deletions.kept or deletions.withheld:
            self.keep(missing, deletions, current.id_schema, None)
        self.run.lock.check()
        self.sync.finish(phase)

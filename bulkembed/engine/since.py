"""An incremental run (`--since`), into a new Parquet output (with a change set) or a
LanceDB table synced in place: what it reads of the previous output before the units run
(rows to carry over, the sink of upserts), and what it does once every input unit is done
(`bulkembed.deletions`): ids gone are deleted (or listed in `deletes.parquet`) if the run is
within its limits, and the previous rows it keeps with no input unit to hold them (their
record or file could not be read, or the deletes were withheld) are written as units of
their own (`KeptUnits`), so that the output holds every row a store holds once the change
set is applied. That end step can be repeated: it starts by discarding the kept units of an
earlier attempt and comes to the same result, but for the deletes a table synced in place
has begun to apply (their decision is noted first in the configuration, and kept).

A finished output whose deletes were withheld takes them up again when it is run with
limits that allow them (`reopens`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from bulkembed.carry import CarryOver, reading_previous
from bulkembed.contracts import UnitRecord
from bulkembed.deletions import Deletions, Missing, Unread, decide, kept_rows, missing_ids
from bulkembed.deletions import allowed_deletes as allowed
from bulkembed.engine.modes import PlainRun, RunMode, UpsertSinks, no_upserts
from bulkembed.errors import OutputError
from bulkembed.incremental import ChangeSet, PreviousOutput
from bulkembed.schema import CONTENT_HASH, EMBEDDING_COLUMNS
from bulkembed.sinks import Sink
from bulkembed.storage import location, parquet_file
from bulkembed.summary import PreviousCounts, over_bad_record_limit
from bulkembed.wording import counted
from bulkembed.writer import KeptUnits, PartWriter

if TYPE_CHECKING:
    import numpy as np

    from bulkembed.encoders.base import VectorSizes
    from bulkembed.engine.plan import RunPlan
    from bulkembed.engine.sync import TableSync
    from bulkembed.run_dir import RunDirectory


def mode_of(
    plan: RunPlan,
    run: RunDirectory,
    sink: Sink,
    settings: dict[str, Any],
    sync: TableSync | None = None,
) -> RunMode:
    """The mode of a run writing `sink` with run directory `run` (`bulkembed.engine.modes`):
    incremental with `--since` (`sync` when it updates a LanceDB table in place), else
    plain."""
    if plan.config.since is None:
        return PlainRun()
    return Incremental(plan, run, sink, settings, sync)


def _split(done: dict[str, UnitRecord]) -> tuple[dict[str, UnitRecord], dict[str, UnitRecord]]:
    """The input units, and the units of kept rows."""
    inputs = {p: r for p, r in done.items() if not r.kept}
    return inputs, {p: r for p, r in done.items() if r.kept}


class Incremental:
    """A `--since` run writing `sink` with run directory `run`; `sync` when it updates a
    LanceDB table in place (`run` and `sink` are then the sync's own)."""

    def __init__(
        self,
        plan: RunPlan,
        run: RunDirectory,
        sink: Sink,
        settings: dict[str, Any],
        sync: TableSync | None,
    ) -> None:
        self.plan = plan
        self.run = run
        self.sink = sink
        self.settings = settings
        self.sync = sync
        before = run.read_config() if run.config_path.exists() else {}
        self.previous_rows: int | None = before.get("previous_rows")
        # The end step's decision, once made (a crash after it, or a finished output); and
        # whether an end step began (kept once its decision is dropped by `reopen`). A sync
        # of an earlier version noted its end step as `table_deleted`, `table_finished`.
        self.deletions = Deletions.from_dict(before.get("deletions"))
        notes = ("ended", "table_deleted", "table_finished")
        self.ended = self.deletions is not None or any(before.get(n) for n in notes)
        if sync is not None and sync.version is None:
            sync.version = before.get("previous_version")
        self.previous: PreviousOutput | None = None
        self.change_set: ChangeSet | None = None
        self._upserts: UpsertSinks = no_upserts

    def start(self, done: dict[str, UnitRecord], complete: bool) -> bool:
        reopened = complete and self.reopens(done)
        self.prepare(complete and not reopened)
        if reopened:
            self.reopen()
        return complete and not reopened

    def describe(self) -> str:
        previous = self.previous
        if previous is None:
            return ""
        return (
            f"reusing the vectors of {counted(previous.rows, 'document')} in {previous.path} "
            "where the text is unchanged"
        )

    def carrier(self) -> CarryOver:
        return CarryOver(None, []) if self.previous is None else self.previous.carrier

    def sizes(self) -> VectorSizes | None:
        return None if self.previous is None else self.previous.sizes()

    def upserts(self) -> UpsertSinks:
        return self._upserts

    def changes(self) -> PreviousCounts | None:
        if self.previous_rows is None:
            return None
        return PreviousCounts(self.previous_rows, self.deletions)

    def reopens(self, done: dict[str, UnitRecord]) -> bool:
        """Whether a finished output whose deletes were withheld is run with limits that
        allow them now (then `reopen` it, once `prepare` has read what its end step
        needs)."""
        withheld = self.deletions.withheld if self.deletions is not None else 0
        if not withheld or self.previous_rows is None:
            return False
        config = self.plan.config
        inputs, _ = _split(done)
        bad = sum(r.bad_records for r in inputs.values())
        read = sum(r.rows for r in inputs.values()) + bad
        if over_bad_record_limit(config.max_bad_records, bad, read):
            return False
        return withheld <= allowed(config.max_deletes, self.previous_rows)

    def reopen(self) -> None:
        """A finished output whose deletes were withheld is no longer complete: its end
        step runs again, and decides anew."""
        self.run.complete_path.unlink(missing_ok=True)
        self.deletions = None

    def prepare(self, complete: bool) -> None:
        """Read the previous output where it is needed: to carry rows over while input
        units are pending, and for a Parquet output's end step. A table synced in place is
        read as it was when the sync began only until its end step started (which may
        compact that version away)."""
        config = self.plan.config
        if self.sync is not None:
            self._upserts = self.sync.upserts()
            if complete or self.ended:
                return
            self.previous = self.sync.previous(self.plan.id_key)
            self.previous.carrier.keeps_unread = True
        elif complete:
            return
        else:
            since = location(config.since or "", self.plan.storage_options)
            self.previous = PreviousOutput(since, self.settings, self.plan.id_key)
            if self.plan.target.capabilities.change_set:
                self.change_set = ChangeSet(self.run.meta)
                self.change_set.open(self.plan.my_units)
                self._upserts = self.change_set.upserts
                self.previous.carrier.keeps_unread = self.plan.config.limit is None
        self.previous_rows = self.previous.rows
        _share_quantization(self.plan, self.run, self.previous)

    def close(self) -> None:
        """Let go of the previous output's lookup."""
        if self.previous is not None:
            self.previous.close()

    def state(self) -> dict[str, Any]:
        if not self.ended and self.run.config_path.exists():
            # A `--shard` run that found every unit done may have begun the end step since
            # this run read the configuration: its decision stands, and is kept.
            noted = self.run.read_config()
            if noted.get("ended"):
                self.deletions = Deletions.from_dict(noted.get("deletions"))
                self.ended = True
        deletions = None if self.deletions is None else self.deletions.as_dict()
        state = {"previous_rows": self.previous_rows, "deletions": deletions, "ended": self.ended}
        if self.sync is not None:
            state["previous_version"] = self.sync.version
        return state

    def _note(self, deletions: Deletions) -> None:
        self.deletions, self.ended = deletions, True
        noted = {"deletions": deletions.as_dict(), "ended": True}
        self.run.write_config({**self.run.read_config(), **noted})

    def end(self, phase: Callable[[str], None]) -> Callable[[], None] | None:
        """The deletes and the kept rows, once every input unit is done (None when nothing
        ends the run: `--limit`, a stream)."""
        if self.plan.config.limit is not None:
            return None
        if self.sync is not None:
            return lambda: self._end_sync(phase)
        if self.change_set is not None:
            return self._end_change_set
        return None

    def _start_end(self) -> tuple[dict[str, UnitRecord], Unread, bool]:
        """Discard the kept units of an earlier attempt; return the input units, what the
        run could not read, and whether it is over its bad-record limit."""
        inputs, kept = _split(self.run.done_units())
        for part in kept:
            self.run.ledger.forget(part)
        self.sink.discard(kept)
        bad_records = self.run.bad_records(inputs)
        unread = Unread.of(bad_records, bool(self.plan.unread_directories), self.plan.id_key)
        bad = sum(r.bad_records for r in inputs.values())
        read = sum(r.rows for r in inputs.values()) + bad
        return inputs, unread, over_bad_record_limit(self.plan.config.max_bad_records, bad, read)

    def _decide(self, missing: list[Missing], over_bad_records: bool) -> Deletions:
        assert self.previous_rows is not None
        gone = sum(int(m.gone.sum()) for m in missing)
        kept = sum(int(m.kept.sum()) for m in missing)
        limit = self.plan.config.max_deletes
        return decide(gone, kept, self.previous_rows, limit, over_bad_records)

    def _end_change_set(self) -> None:
        """The deletes of the change set, and the rows kept in the new output."""
        assert self.change_set is not None and self.previous is not None
        inputs, unread, over = self._start_end()
        ids = self.sink.committed_ids(inputs)
        missing = list(missing_ids(self.previous, ids, unread, self.plan.id_key))
        deletions = self._decide(missing, over)
        if self.previous.other_weights and (deletions.kept or deletions.withheld):
            raise OutputError(
                f"--since {self.previous.path} was made with other weights, and "
                f"{counted(deletions.kept + deletions.withheld, 'row')} of it would stay in "
                "this output as it is (a record that could not be read, or a delete "
                "--max-deletes held), with a vector of those weights; read every input whole "
                "and allow the deletes, then run again (or run without --since)"
            )
        self._note(deletions)
        if deletions.kept or deletions.withheld:
            schema = self._part_schema(inputs)
            self._keep(missing, deletions, schema, self.previous.rows_at)
        gone = [m.ids.filter(pa.array(m.gone)) for m in missing if deletions.deleted]
        kind = missing[0].ids.type if missing else self.plan.reader.id_type or pa.string()
        self.change_set.write_deletes(pa.chunked_array([c for g in gone for c in g.chunks], kind))

    def _end_sync(self, phase: Callable[[str], None]) -> None:
        """Delete the ids gone from the table synced in place, keep the others in the
        sync's ledger, and finish the table. The table now holds the previous version's
        ids and the merged ones: what it holds beyond the input units' ids is what the
        previous version held beyond them."""
        assert self.sync is not None
        inputs, unread, over = self._start_end()
        current = self.sync.current()
        held = self.sink.committed_ids(inputs)
        missing = list(missing_ids(current, held, unread, self.plan.id_key))
        deletions = self.deletions
        if deletions is None or not deletions.deleted:
            # Deletes once begun are finished with the decision that began them.
            deletions = self._decide(missing, over)
            self._note(deletions)
        if deletions.deleted:
            self.run.lock.check()
            self.sync.delete([m.ids.filter(pa.array(m.gone)) for m in missing])
        if deletions.kept or deletions.withheld:
            self._keep(missing, deletions, current.id_schema, None)
        self.run.lock.check()
        self.sync.finish(phase)

    def _keep(
        self,
        missing: list[Missing],
        deletions: Deletions,
        schema: pa.Schema,
        rows_at: Callable[[int, np.ndarray], pa.Table] | None,
    ) -> None:
        """Write the kept rows, and the withheld ones, as units of their own (their columns
        from `rows_at`, see `kept_rows`)."""
        run = self.run
        writer = PartWriter(run.run_id, self.sink, schema, run.committed, run.lock.check)
        units = KeptUnits(writer, len(self.plan.files), self.plan.config.records_per_unit)
        try:
            for found in missing:
                which = (found.kept | found.gone) if deletions.withheld else found.kept
                if which.any():
                    units.add(kept_rows(found, which, schema, rows_at))
            units.finish()
        finally:
            writer.close()

    def _part_schema(self, inputs: dict[str, UnitRecord]) -> pa.Schema:
        """The schema of the output's parts: an input part's, or, with none (no input
        unit has a row), the previous output's with this run's passthrough columns."""
        assert self.previous is not None
        for part, record in inputs.items():
            schema = self.sink.part_schema(part) if record.rows else None
            if schema is not None:
                return schema
        with reading_previous(self.previous.parts[0]):
            first = parquet_file(self.previous.parts[0]).schema_arrow
        fields = [f for f in first if f.name in ("id", *EMBEDDING_COLUMNS, CONTENT_HASH)]
        types = self.plan.reader.column_types
        fields += [pa.field(name, kind) for name, kind in types.items()]
        return pa.schema(fields, metadata=first.metadata)


def _share_quantization(plan: RunPlan, run: RunDirectory, previous: PreviousOutput) -> None:
    """Carried-over rows keep the previous output's int8/uint8 scale: so must new ones."""
    quantize = plan.output_format.quantize
    if quantize not in ("int8", "uint8") or run.read_quantization_ranges() is not None:
        return
    if previous.other_weights:
        return  # nothing is carried over: the new vectors take a scale of their own
    assert quantize is not None
    previous_run = previous.run
    ranges = previous_run.read_quantization_ranges()
    if ranges is None:
        raise OutputError(
            f"--since {previous.path}: {previous_run.quantization_path} is missing, so its "
            "int8/uint8 vectors cannot be matched; restore it, or run without --since"
        )
    run.write_quantization_ranges(quantize, ranges)

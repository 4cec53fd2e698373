"""What the two `--since` modes share (`change_set`, `in_place`): the previous output read
before units run, the state kept across restarts in the mode's file, and the end step.

Once every input unit is done (`bulkembed.incremental.deletions`), ids gone are deleted (or listed
as deletes) if the run is within its limits, and the previous rows it keeps with no input unit to
hold them (their record or file could not be read, or the deletes were withheld) are written as
units of their own (`KeptUnits`), so that the output holds every row a store holds once the changes
are applied. That end step can be repeated: it starts by discarding the kept units of an earlier
attempt and comes to the same result, but for deletes that have begun to be applied (their decision
is noted in the mode's file first, and kept).

A finished output whose deletes were withheld takes them up again when it is run with
limits that allow them (`reopens`).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from bulkembed.engine.modes.base import Mode, OpenedRun, opened_directory
from bulkembed.engine.modes.upserts import UpsertSinks, no_upserts
from bulkembed.engine.writer import KeptUnits, PartWriter
from bulkembed.errors import OutputError
from bulkembed.incremental.carry import CarryOver
from bulkembed.incremental.deletions import Deletions, Missing, Unread, decide, kept_rows
from bulkembed.incremental.deletions import allowed_deletes as allowed
from bulkembed.reporting.summary import PreviousCounts, over_bad_record_limit
from bulkembed.wording import counted

if TYPE_CHECKING:
    import numpy as np

    from bulkembed.contracts import UnitRecord
    from bulkembed.encoders.base import VectorSizes
    from bulkembed.engine.plan import RunPlan
    from bulkembed.incremental.previous import PreviousOutput
    from bulkembed.reporting.progress import Reporter
    from bulkembed.run_dir import RunDirectory
    from bulkembed.sinks import Sink

# What earlier versions noted of an end step that began.
_ENDED = ("ended", "table_deleted", "table_finished")


def split_kept(done: dict[str, UnitRecord]) -> tuple[dict[str, UnitRecord], dict[str, UnitRecord]]:
    """The input units, and the units of kept rows."""
    inputs = {p: r for p, r in done.items() if not r.kept}
    return inputs, {p: r for p, r in done.items() if r.kept}


class Incremental(Mode, ABC):
    """A `--since` run; `prepare` reads the previous output, `end` the end step."""

    plan: RunPlan
    run: RunDirectory
    sink: Sink
    settings: dict[str, Any]

    def __init__(self) -> None:
        self.previous: PreviousOutput | None = None
        self.previous_rows: int | None = None
        # The end step's decision, once made (a crash after it, or a finished output); and
        # whether an end step began (kept once its decision is dropped by `reopen`).
        self.deletions: Deletions | None = None
        self.ended = False
        self._upserts: UpsertSinks = no_upserts

    @abstractmethod
    def prepare(self, complete: bool) -> None:
        """Read the previous output where the run needs it (`complete`: the output is)."""

    def _begin(
        self, plan: RunPlan, run: RunDirectory, sink: Sink, settings: dict[str, Any]
    ) -> dict[str, Any]:
        """Take up the opened output, and what the mode kept of an earlier attempt."""
        self.plan, self.run, self.sink, self.settings = plan, run, sink, settings
        self.mine = plan.my_units
        before = run.read_mode_state()
        self.previous_rows = before.get("previous_rows")
        self.deletions = Deletions.from_dict(before.get("deletions"))
        self.ended = self.deletions is not None or any(before.get(n) for n in _ENDED)
        return before

    def _start(self, done: dict[str, UnitRecord], complete: bool) -> bool:
        """Read what the run needs; whether the output is complete now."""
        reopened = complete and self.reopens(done)
        self.prepare(complete and not reopened)
        if reopened:
            # Its end step runs again, and decides anew.
            self.run.complete_path.unlink(missing_ok=True)
            self.deletions = None
        if not self.ended and self.run.mode_path.exists():
            # A `--shard` run that found every unit done may have begun the end step since
            # this run read the mode's file: its decision stands, and is kept.
            noted = self.run.read_mode_state()
            if noted.get("ended"):
                self.deletions = Deletions.from_dict(noted.get("deletions"))
                self.ended = True
        self.run.write_mode_state(self.state())
        return complete and not reopened

    def state(self) -> dict[str, Any]:
        """What the mode's file keeps across restarts."""
        deletions = None if self.deletions is None else self.deletions.as_dict()
        return {"previous_rows": self.previous_rows, "deletions": deletions, "ended": self.ended}

    def reopens(self, done: dict[str, UnitRecord]) -> bool:
        """Whether a finished output whose deletes were withheld is run with limits that
        allow them now."""
        withheld = self.deletions.withheld if self.deletions is not None else 0
        if not withheld or self.previous_rows is None:
            return False
        config = self.plan.config
        inputs, _ = split_kept(done)
        bad = sum(r.bad_records for r in inputs.values())
        read = sum(r.rows for r in inputs.values()) + bad
        if over_bad_record_limit(config.run.max_bad_records, bad, read):
            return False
        return withheld <= allowed(config.run.max_deletes, self.previous_rows)

    def describe(self) -> str:
        previous = self.previous
        if previous is None:
            return ""
        return (
            f"reusing the vectors of {counted(previous.rows, 'document')} in {previous.path} "
            "where the text is unchanged"
        )

    def carrier(self) -> CarryOver:
        return CarryOver(None) if self.previous is None else self.previous.carrier

    def sizes(self) -> VectorSizes | None:
        return None if self.previous is None else self.previous.sizes()

    def upserts(self) -> UpsertSinks:
        return self._upserts

    def changes(self) -> PreviousCounts | None:
        if self.previous_rows is None:
            return None
        return PreviousCounts(self.previous_rows, self.deletions)

    @contextlib.contextmanager
    def opened(
        self,
        plan: RunPlan,
        run: RunDirectory,
        sink: Sink,
        reporter: Reporter,
        begun: Callable[[dict[str, Any]], None] = lambda state: None,
    ) -> Iterator[OpenedRun]:
        """The run directory opened (`opened_directory`) with the mode's state taken up
        (`begun` is told the state an earlier attempt kept) and the previous output read;
        the previous output is let go on the way out."""

        def start(settings: dict[str, Any], done: dict[str, UnitRecord], whole: bool) -> bool:
            begun(self._begin(plan, run, sink, settings))
            return self._start(done, whole)

        try:
            with opened_directory(plan, run, sink, reporter, start) as opened:
                yield opened
        finally:
            if self.previous is not None:
                self.previous.close()

    def note(self, deletions: Deletions) -> None:
        """The end step's decision, noted before it is acted on."""
        self.deletions, self.ended = deletions, True
        self.run.write_mode_state(self.state())

    def start_end(self) -> tuple[dict[str, UnitRecord], Unread, bool]:
        """Discard the kept units of an earlier attempt; return the input units, what the
        run could not read, and whether it is over its bad-record limit."""
        inputs, kept = split_kept(self.run.done_units())
        for part in kept:
            self.run.ledger.forget(part)
        self.sink.discard(kept)
        bad_records = self.run.bad_records(inputs)
        unread = Unread.of(bad_records, bool(self.plan.unread_directories), self.plan.id_key)
        bad = sum(r.bad_records for r in inputs.values())
        read = sum(r.rows for r in inputs.values()) + bad
        return (
            inputs,
            unread,
            over_bad_record_limit(self.plan.config.run.max_bad_records, bad, read),
        )

    def decide(self, missing: list[Missing], over_bad_records: bool) -> Deletions:
        assert self.previous_rows is not None
        gone = sum(int(m.gone.sum()) for m in missing)
        kept = sum(int(m.kept.sum()) for m in missing)
        limit = self.plan.config.run.max_deletes
        return decide(gone, kept, self.previous_rows, limit, over_bad_records)

    def keep(
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
        units = KeptUnits(writer, len(self.plan.files), self.plan.config.inputs.records_per_unit)
        try:
            for found in missing:
                which = (found.kept | found.gone) if deletions.withheld else found.kept
                if which.any():
                    units.add(kept_rows(found, which, schema, rows_at))
            units.finish()
        finally:
            writer.close()


def share_quantization(plan: RunPlan, run: RunDirectory, previous: PreviousOutput) -> None:
    """Carried-over rows keep the previous output's int8/uint8 scale: so must new ones; and
    its int8 model (`share_int8`)."""
    from bulkembed.engine.int8_check import share_int8

    if plan.spec.int8 is not None and not previous.other_weights:
        share_int8(run, previous.run)
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

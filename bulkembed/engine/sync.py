"""In-place sync of a LanceDB table: `--output lancedb://PATH?table=T --since` the same table.

The table's own run directory (`PATH/_bulkembed/T/`) keeps the run that wrote it, and is
locked for the whole sync. The sync is a run of its own, whose output is `sync/` below it:
a Parquet part per unit holding only the unit's ids (`IdParts`), and its run directory
(`sync/_bulkembed/`: configuration, mode's file, ledger, summary). The previous content is
the table at the version it had when the sync began (`previous_version` in the mode's file,
read again on resume), so that a resumed sync classifies every document as the first
attempt did.

For each unit, in this order: its new and changed rows are merged into the table by id
(`TableMerge`), its id part is committed, its done-marker written. A unit replayed after a crash
merges the same rows again, which changes nothing. Once every unit is done the sync decides what it
deletes (`bulkembed.engine.modes.in_place`, `bulkembed.incremental.deletions`): the ids the table
holds beyond the input units' ids are what the previous version held beyond them; those the input no
longer has are deleted (the decision is noted in the mode's file first, so that a crash halfway
finishes the same deletes), those it could not read, or whose deletes were withheld, are kept as id
parts of their own. Then the table is compacted (and indexed, with `--index`), and the sync is
marked complete. A crash before that repeats the end step; once it has begun the previous version is
not read again (the compaction may have removed it). The next sync with other inputs starts its run
directory over.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from bulkembed.config import Engine, RunConfig
from bulkembed.errors import UsageError
from bulkembed.incremental.previous import PreviousTable
from bulkembed.run_dir import LockedError, RunDirectory, describe_changes
from bulkembed.run_dir.intents import Intents
from bulkembed.run_dir.lease import directory_lock
from bulkembed.sinks import (
    OutputTarget,
    Sink,
    SinkSettings,
    in_place,
    make_sink,
    parse_output,
    sink_of,
)
from bulkembed.sources import IdKey
from bulkembed.storage import StorageOptions

if TYPE_CHECKING:
    from bulkembed.engine.plan import RunPlan
    from bulkembed.sinks import OutputRows

# The sync's run directory, below the table's.
SYNC_DIRECTORY = "sync"
# How long a `--shard` run of a sync waits for the table while another shard holds it
# alone (deciding whether to start the sync over, and doing so).
SHARD_START_SECONDS = 120.0


def syncs_in_place(config: RunConfig, target: OutputTarget, options: StorageOptions) -> bool:
    """Whether `--since` names the `--output` table (then updated in place); a `--since`
    of a kind synced in place that names another output is refused."""
    if config.run.since is None:
        return False
    since = parse_output(config.run.since, options)
    if not since.capabilities.in_place:
        return False
    if (since.kind, since.label) != (target.kind, target.label):
        raise UsageError(
            f"--since {config.run.since}: a {since.kind} output can only be synced in place: "
            "pass the same URI as --output"
        )
    if config.inputs.limit is not None:
        raise UsageError(
            "--limit cannot be combined with syncing a LanceDB table in place: the documents "
            "past the limit would be deleted from it"
        )
    if config.run.engine is Engine.RAY:
        raise UsageError(
            "--engine ray cannot be combined with syncing a LanceDB table in place: its "
            "tasks read the table's rows in this process only; sync it with --shard I/N, or "
            "write a Parquet output with --engine ray and --since and apply its change set"
        )
    return True


def latest_run(target: OutputTarget) -> tuple[RunDirectory, Sink]:
    """The run directory and sink that say where `target` stands: for a table synced in
    place, its latest sync (whose ledger covers every document of the table); otherwise
    the run that wrote it."""
    run = RunDirectory.for_target(target, None)
    sink = sink_of(target)
    if target.capabilities.in_place:
        synced = RunDirectory(run.meta / SYNC_DIRECTORY)
        if synced.config_path.exists():
            return synced, in_place(target, sink).id_parts(synced.output)
    return run, sink


def refuse_synced(plan: RunPlan) -> None:
    """Refuse a run without `--since` into a table that a sync changed since its ledger was
    written (unless `--overwrite`): that ledger no longer describes the table."""
    config = plan.config
    if (
        not plan.target.capabilities.in_place
        or config.run.overwrite
        or config.run.since is not None
    ):
        return
    run = RunDirectory.for_target(plan.target, None)
    if run.config_path.exists() and run.read_config().get("synced"):
        raise UsageError(
            f"{run.label} was synced in place since this run wrote it: sync it again with "
            "--since naming the table, or start over with --overwrite"
        )


class TableSync:
    """What an in-place sync of the `--output` table needs (see the module's docstring)."""

    def __init__(self, plan: RunPlan, settings: dict[str, Any]) -> None:
        config = plan.config
        self.settings = settings
        self.shard = config.run.shard
        self.table_run = RunDirectory.for_target(
            plan.target, config.run.shard, config.run.break_lock
        )
        intents = Intents(self.table_run.meta)
        sink = make_sink(plan.target, SinkSettings.of(config, plan.spec.normalize, intents))
        self.table = in_place(plan.target, sink)
        self.directory = self.table_run.meta / SYNC_DIRECTORY
        # Named in messages by the table, not by where its sync keeps its ledger.
        label = f"the sync of {plan.target.label}"
        self.run = RunDirectory(
            self.directory, None, label, config.run.shard, config.run.break_lock
        )
        self.version: int | None = None

    def staging(self, plan: RunPlan) -> tuple[RunPlan, RunDirectory, Sink]:
        """The sync's own run: its plan (writing the sync's directory, named by the table),
        run directory and sink of id parts. A sync that finished with other settings (last
        night's inputs) is started over (for `--shard` runs, by `lock`)."""
        config = plan.config
        overwrite = config.run.overwrite or (self.shard is None and self._finished_before())
        staged = config.changed(output=str(self.directory), overwrite=overwrite)
        # The plan keeps the table as its target: what the summary and messages name.
        return replace(plan, config=staged), self.run, self.table.id_parts(self.directory)

    def _finished_before(self) -> bool:
        """Whether the sync's directory holds a finished sync with other settings."""
        if not (self.run.config_path.exists() and self.run.is_complete()):
            return False
        before = self.run.read_config().get("fingerprint", {})
        return bool(describe_changes(before, self.settings))

    def lock(self) -> None:
        """Hold the table's run directory: no other run writes the table meanwhile (but the
        other `--shard` runs of the same sync). The first shard run to start a sync starts
        the directory of a finished one over, holding the table alone meanwhile; the others
        find the table held by that shard, or the sync under way."""
        if not self.table_run.config_path.exists():
            raise UsageError(
                f"--since {self.table_run.label}: no table that bulkembed wrote is there; "
                "run once without --since to create it"
            )
        if self.shard is None:
            self.table_run.acquire_lock()
            return
        whole = directory_lock(self.table_run.meta, self.table_run.label, None)
        try:
            whole.acquire()
        except LockedError:
            pass  # a shard run holds it: that one started the sync
        else:
            try:
                if self._finished_before():
                    self.run.start_over(self.table.id_parts(self.directory))
            finally:
                whole.release()
        # Another shard may hold the table alone for a moment, starting the sync over.
        deadline = time.monotonic() + SHARD_START_SECONDS
        while True:
            try:
                self.table_run.acquire_lock()
                return
            except LockedError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1.0)

    def unlock(self) -> None:
        self.table_run.release_lock()

    def previous(self, id_key: IdKey) -> PreviousTable:
        """The table as it was when the sync began (its ids hashed with `id_key`)."""
        if self.run.config_path.exists():
            self.version = self.run.read_mode_state().get("previous_version")
        self.version = self.version or self.table.version()
        found = self.table.rows(self.version)
        label = self.table_run.label
        return PreviousTable(self.table_run, found, self.settings, label, id_key)

    def upserts(self) -> Callable[[], Sink]:
        """What makes a sink that merges units' rows into the table (one per process)."""
        return self.table.merging()

    def current(self) -> CurrentTable:
        """The table as it is now: the previous version's rows and those merged since."""
        return CurrentTable(self.table.rows())

    def delete(self, ids: list[pa.ChunkedArray]) -> None:
        """Delete the rows of `ids` from the table (ids gone already are no matter)."""
        self.table.delete(i for array in ids for i in array.to_pylist())

    def finish(self, phase: Callable[[str], None]) -> None:
        """Every unit is merged and the deletes are done: compact the table and build its
        indexes (each step named to `phase`), and note that a sync changed it."""
        self.table.finish(phase)
        table = self.table_run
        table.write_config({**table.read_config(), "synced": True})


class CurrentTable:
    """A LanceDB table's ids as they are now, as one table; `id_schema` is the schema of
    its `id` column alone."""

    def __init__(self, rows: OutputRows) -> None:
        self._rows = rows
        self.id_schema = pa.schema([rows.id_field()])

    def id_tables(self) -> Iterator[pa.Table]:
        yield self._rows.read(["id"])

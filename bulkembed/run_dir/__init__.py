"""The run directory `OUT/_bulkembed/`: configuration, lock, ledger, quarantine, summary.

Resume rests on one ordering: a unit's part is committed by the sink (for Parquet: written
under a temporary name, then renamed) before its done-marker `done/<part>.json` is written,
also atomically. So on any restart, in `reconcile`:

- a marker names a unit whose rows are all in its part: the unit is skipped;
- a complete part without a marker (a crash between the two writes, or a lost marker) is
  taken back into the ledger when its footer says this run wrote it; rows of a unit cut
  short are dropped and redone;
- a marker whose rows are gone (a part deleted by hand) is forgotten: the unit is embedded
  again, and the output is not complete until it is (`complete` names how many units
  there are, so a unit that lost both its marker and its part is found too);
- what cannot be told apart from a file bulkembed did not write is refused, never deleted.

A unit's bad records are kept in its marker too; `bad_records.jsonl` is rebuilt from the
markers at every start, so a replayed unit does not report its bad records twice and a lost
or damaged quarantine file comes back whole.
"""

from __future__ import annotations

import contextlib
import secrets
import sys
from collections.abc import Callable, Collection, Iterator
from typing import TYPE_CHECKING, Any

from bulkembed.contracts import RUN_DIRECTORY, UnitRecord
from bulkembed.errors import (
    BulkembedError,
    OutputError,
    UnaccountedRows,
    exit_status,
    one_line,
)
from bulkembed.run_dir.files import (
    CONFIG_FILE,
    MARKER,
    MODE_FILE,
    OWN_FILES,
    OWN_NAMES,
    TEMPORARY,
    read_json,
    write_json_atomically,
)
from bulkembed.run_dir.fingerprint import describe_changes, fingerprint
from bulkembed.run_dir.lease import directory_lock
from bulkembed.run_dir.ledger import Ledger
from bulkembed.run_dir.lock import LockedError
from bulkembed.run_dir.quarantine import Quarantine
from bulkembed.run_dir.saved_files import saved_files
from bulkembed.storage import AnyPath, scratch_folder
from bulkembed.wording import counted

if TYPE_CHECKING:
    from bulkembed.config import ShardSpec
    from bulkembed.sinks import OutputTarget, Sink

__all__ = ["LockedError", "RunDirectory", "describe_changes", "fingerprint"]


class RunDirectory:
    """The bookkeeping of a run: by default in `OUT/_bulkembed/`, next to the Parquet parts.

    `label` names the output in messages (default: `output`). On object storage the
    directory is held by a lease (`ObjectLease`), which `take_over` takes even from a live
    holder (`--break-lock`)."""

    def __init__(
        self,
        output: AnyPath,
        meta: AnyPath | None = None,
        label: str | None = None,
        shard: ShardSpec | None = None,
        take_over: bool = False,
    ) -> None:
        self.output = output
        self.label = label or str(output)
        self.meta = meta or output / RUN_DIRECTORY
        self.shard = shard
        self.config_path = self.meta / CONFIG_FILE
        self.summary_path = self.meta / "summary.json"
        self.mode_path = self.meta / MODE_FILE
        self.failure_path = self.meta / "failed.json"
        self.shards_path = self.meta / "shards.json"
        # A shard writes no snapshot as it goes: the others' markers are not its to vouch for.
        self.ledger = Ledger(self.meta, periodic=shard is None)
        self.done_dir = self.ledger.done_dir
        self.complete_path = self.ledger.complete_path
        self.lock = directory_lock(self.meta, self.label, shard, take_over)
        self.lock_path = self.lock.lock_path
        quarantine = "bad_records.jsonl"
        if shard is not None:
            quarantine = f"bad_records.shard-{shard.index}-of-{shard.count}.jsonl"
        self.bad_records_path = self.meta / quarantine
        self.quarantine = Quarantine(self.bad_records_path)
        self._run_id: str | None = None
        # What `reconcile` found and mended, one line each, for the run to report.
        self.repairs: list[str] = []

    @classmethod
    def for_target(
        cls, target: OutputTarget, shard: ShardSpec | None, take_over: bool = False
    ) -> RunDirectory:
        """The bookkeeping of `--output`; a stream's lives in a temporary directory, which
        the run removes at the end."""
        meta = target.run_directory
        if meta is None:
            meta = scratch_folder("stream")
        return cls(target.path or meta, meta, target.label, shard, take_over)

    def open(
        self,
        fingerprint: dict[str, Any],
        overwrite: bool,
        sink: Sink,
        mine: Collection[str] | None = None,
    ) -> dict[str, UnitRecord]:
        """Lock the directory and make it and `sink` ready to run `fingerprint`; return the
        done units (of every run that shares the output).

        A directory holding a run with another fingerprint is refused unless `overwrite`,
        which removes bulkembed's own files from it and from the sink, and nothing else.
        With `mine` (the units of a `--shard` run) only what those units left half-done
        is cleaned up: other shards may be running.
        """
        fresh = not self.config_path.exists()
        marked = self.ledger.marked()
        if fresh and marked and not overwrite:
            start_over = "remove the output" if self.shard else "pass --overwrite"
            raise OutputError(
                f"{self.config_path} is missing but {counted(len(marked), 'unit')} are marked "
                "done: the settings they were embedded with are unknown; "
                f"{start_over} to start over"
            )
        if fresh and not marked:
            # With markers, the ledger shows what bulkembed wrote there.
            self._check_foreign(sink, overwrite)
        try:
            self.meta.mkdir(parents=True, exist_ok=True)
            self.lock.acquire()
        except OSError as e:
            raise OutputError(
                f"cannot write to {self.label}: {e.strerror or e}; choose another --output"
            ) from e
        try:
            if overwrite:
                self.start_over(sink)
            elif self.shard is not None:
                self._join_shards(fingerprint)
            elif not fresh:
                self._check_fingerprint(fingerprint)
            if self.config_path.exists():
                self._run_id = self.read_config().get("run")
            self._run_id = self._run_id or secrets.token_hex(8)
            self.done_dir.mkdir(exist_ok=True)
            try:
                return self.reconcile(sink, mine)
            except BulkembedError as e:
                # Damage found: `status` says the output failed until a run mends it.
                with contextlib.suppress(OSError, BulkembedError):
                    self.record_failure(exit_status(e), one_line(e), damaged=True)
                raise
        except BaseException:
            self.lock.release()
            raise

    @property
    def run_id(self) -> str:
        """The id of the run that owns this directory, kept in its configuration and in
        the footer of every part it writes."""
        if self._run_id is None:
            self._run_id = self.read_config().get("run")
            if self._run_id is None:
                raise OutputError(f"{self.config_path} names no run: the output is damaged")
        return self._run_id

    def _check_foreign(self, sink: Sink, overwrite: bool) -> None:
        """Refuse an output that holds what bulkembed did not write. Another `--shard` run
        of the same job array may have claimed the output (its config) and written to it
        since this one looked: what it wrote comes after its claim, so a claim found now
        shows that it is bulkembed's."""
        try:
            sink.check_foreign(overwrite)
        except OutputError:
            if self.shard is None or not self.config_path.exists():
                raise

    def _join_shards(self, fingerprint: dict[str, Any]) -> None:
        """The first `--shard` run to start fixes the settings and N, atomically; the others
        must match both."""
        assert self.shard is not None
        claim = {"fingerprint": fingerprint, "run": secrets.token_hex(8)}
        if not write_json_atomically(self.config_path, claim, exclusive=True):
            self._check_fingerprint(fingerprint)
        count = {"count": self.shard.count}
        if not write_json_atomically(self.shards_path, count, exclusive=True):
            before = read_json(self.shards_path).get("count")
            if before != self.shard.count:
                raise OutputError(
                    f"{self.label} is shared out among runs with --shard I/{before}: pass the "
                    "same N, or remove the output to start over with another"
                )

    def _check_fingerprint(self, fingerprint: dict[str, Any]) -> None:
        before = read_json(self.config_path).get("fingerprint", {})
        changes = describe_changes(before, fingerprint)
        if changes:
            raise OutputError(
                f"{self.label} holds a run with other settings ({'; '.join(changes)}): "
                "pass --overwrite to start over, or choose another --output"
            )

    def fence(self) -> Callable[[], None]:
        """What the processes that commit units for this run check before each commit (a
        lease still held, on object storage)."""
        return self.lock.fence()

    def acquire_lock(self) -> None:
        """Hold the output for this run (see `RunLock.acquire`)."""
        self.lock.acquire()

    def release_lock(self) -> None:
        """Let the output go. While an error ends the run, an error in letting it go (the
        store gone with the first one) does not take its place."""
        failing = sys.exc_info()[1] is not None
        try:
            self.lock.release()
        except (OSError, BulkembedError):
            if not failing:
                raise

    def lock_holder(self) -> str | None:
        """Who holds the output now (`pid N on HOST`, or shard runs), or None."""
        return self.lock.holder()

    def start_over(self, sink: Sink) -> None:
        """Remove what bulkembed wrote here and into `sink` (`--overwrite`), and nothing
        else; the caller holds the directory."""
        sink.remove(self.ledger.marked())
        self._remove_previous()

    def _remove_previous(self) -> None:
        """Delete the bookkeeping (the sink has removed the rows): the files bulkembed
        writes here, by name, and nothing else. The ledger goes first and the configuration
        last, so an interrupted removal leaves a state the next run checks and reconciles
        like any other."""
        if self.done_dir.is_dir():
            for path in self.done_dir.iterdir():
                if MARKER.fullmatch(path.name) or TEMPORARY.fullmatch(path.name):
                    path.unlink()
        for path in self.meta.iterdir():
            own = path.name in OWN_FILES or OWN_NAMES.fullmatch(path.name)
            if own and path.is_file() and path != self.lock_path:
                path.unlink()
        self.config_path.unlink(missing_ok=True)

    # The ledger.

    def done_units(self) -> dict[str, UnitRecord]:
        """Every committed unit, by part name; a damaged marker counts as none."""
        return self.ledger.units()[0]

    def reconcile(self, sink: Sink, mine: Collection[str] | None = None) -> dict[str, UnitRecord]:
        """Drop what a crash left half-done, here and in the sink (only in `mine`, when
        given); take back parts whose marker was lost and forget units whose rows are gone,
        noting each in `repairs`; return the done units."""
        temporaries: list[AnyPath] = list(self.done_dir.glob(".*.tmp"))
        if mine is None:
            temporaries += self.meta.glob(".*.tmp")
        for path in temporaries:
            ours = TEMPORARY.fullmatch(path.name)
            if ours and (mine is None or path.name[1:].split(".")[0] in mine):
                path.unlink(missing_ok=True)
        done, damaged = self.ledger.units()
        try:
            recovered = sink.reconcile(done, self.run_id, mine)
        except UnaccountedRows:
            # Another shard may have marked its last units done and compacted the table
            # between the two reads: the compaction came after every marker, so a ledger
            # read now holds them all. Damage fails again.
            done, damaged = self.ledger.units()
            recovered = sink.reconcile(done, self.run_id, mine)
        for fields in recovered.adopted:
            bad = fields.pop("bad", [])
            record = UnitRecord(**fields)
            self.mark_done(record, bad)
            done[record.part] = record
            self.repairs.append(
                f"{record.part}: its done-marker was missing or damaged; the part is complete "
                "and was written by this run, so it is kept"
            )
        forgotten = [p for p in damaged if p not in done and (mine is None or p in mine)]
        for part in forgotten:
            self.ledger.forget(part)
            self.repairs.append(f"{part}: its done-marker is damaged; embedding the unit again")
        for part in recovered.lost:
            self.ledger.forget(part)
            del done[part]
            self.repairs.append(
                f"{part}: its rows are missing from {sink.description} although the unit was "
                "marked done; embedding the unit again"
            )
        # Other shards may be marking units done meanwhile: a shard run takes `complete` back
        # only for units of its own that it forgot.
        if forgotten or recovered.lost or (mine is None and not self.is_complete(done)):
            self.complete_path.unlink(missing_ok=True)
        self.rebuild_quarantine(done, mine)
        return done

    def committed(self, record: UnitRecord, bad: list[dict[str, Any]]) -> None:
        """A unit's part is in place: its bad records go to the quarantine, then it is
        marked done (unless this run lost its hold on the output)."""
        self.lock.check()
        self.quarantine.append(bad, record.part)
        self.mark_done(record, bad)

    def mark_done(self, record: UnitRecord, bad: list[dict[str, Any]]) -> None:
        """Record a unit, with its bad records, as committed; call only once its part is in
        place."""
        self.ledger.mark_done(record, bad)

    def mark_complete(self, units: int) -> None:
        """Every unit of the inputs is done: there are `units` of them. Vectors that an
        interrupted run saved for the next (`bulkembed.engine.saved`) are not needed now."""
        self.ledger.mark_complete(units)
        for path in saved_files(self.meta):
            path.unlink(missing_ok=True)

    def is_complete(self, done: Collection[str] | None = None) -> bool:
        """Whether every unit is done (`Ledger.is_complete`)."""
        return self.ledger.is_complete(done)

    def bad_records(self, done: dict[str, UnitRecord]) -> Iterator[dict[str, Any]]:
        """The bad records of the units in `done`, as their markers keep them."""
        for part, record in done.items():
            if record.bad_records:
                yield from (self.ledger.read(part) or {}).get("bad", [])

    def rebuild_quarantine(
        self, done: dict[str, UnitRecord], mine: Collection[str] | None = None
    ) -> None:
        """Write the quarantine anew from the markers of the done units (of `mine` only,
        when given). A whole run on an output that `--shard` runs wrote leaves their
        quarantine files as they are."""
        if mine is None and self.shards_path.exists():
            return
        self.quarantine.rebuild(done, mine, self.ledger.read)

    # Configuration and summary.

    def read_config(self) -> dict[str, Any]:
        return read_json(self.config_path)

    def write_config(self, config: dict[str, Any]) -> None:
        write_json_atomically(self.config_path, {**config, "run": self.run_id})

    def read_mode_state(self) -> dict[str, Any]:
        """What the run's mode keeps across restarts ({} for none); a run directory of an
        earlier version kept it in the configuration."""
        if self.mode_path.exists():
            return dict(read_json(self.mode_path))
        return self.read_config() if self.config_path.exists() else {}

    def write_mode_state(self, state: dict[str, Any]) -> None:
        write_json_atomically(self.mode_path, state)

    def write_summary(self, summary: dict[str, Any]) -> None:
        write_json_atomically(self.summary_path, summary)

    def record_failure(self, exit_code: int, message: str, damaged: bool = False) -> None:
        """The last run ended with an error (`bulkembed status` says `failed`, or
        `damaged` where it found the output damaged) until the next run starts
        (`clear_failure`)."""
        failure = {"exit_code": exit_code, "error": message, "damaged": damaged}
        write_json_atomically(self.failure_path, failure)

    def clear_failure(self) -> None:
        self.failure_path.unlink(missing_ok=True)

    def read_failure(self) -> dict[str, Any] | None:
        """The exit status and one-line error of the last run, if it failed."""
        return read_json(self.failure_path) if self.failure_path.exists() else None

    def write_vocabulary(self, vocabulary: list[str | None]) -> None:
        write_json_atomically(self.meta / "vocab.json", vocabulary)

    @property
    def quantization_path(self) -> AnyPath:
        return self.meta / "quantization.json"

    def read_quantization_ranges(self) -> list[list[float]] | None:
        """The int8/uint8 ranges ([min per dimension, max per dimension]) of this run."""
        if not self.quantization_path.exists():
            return None
        return read_json(self.quantization_path)["ranges"]

    def write_quantization_ranges(self, precision: str, ranges: list[list[float]]) -> None:
        write_json_atomically(self.quantization_path, {"precision": precision, "ranges": ranges})

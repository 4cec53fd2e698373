"""The run directory `OUT/_bulkembed/`: configuration, ledger, lock, quarantine, summary.

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
import fcntl
import json
import os
import re
import secrets
import socket
import time
from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from bulkembed.contracts import RUN_DIRECTORY
from bulkembed.errors import BulkembedError, OutputError

if TYPE_CHECKING:
    from bulkembed.config import ShardSpec
    from bulkembed.sinks import Sink

LOCK_ATTEMPTS = 10
LOCK_RETRY_SECONDS = 0.1
CONFIG_FILE = "config.json"
# What bulkembed writes in a run directory besides the configuration and the ledger: all
# that `--overwrite` removes there. Anything else is left alone.
_OWN_FILES = (
    "summary.json",
    "complete",
    "vocab.json",
    "quantization.json",
    "shards.json",
    "bad_records.jsonl",
)
# Temporary files: `.NAME.PID-TOKEN.tmp` (`_write_json_atomically`) and the quarantine's.
_TEMPORARY = re.compile(
    r"\..+\.\d+-[0-9a-f]{8}\.tmp|\.bad_records(\.shard-\d+-of-\d+)?\.jsonl\.tmp"
)
_OWN_NAMES = re.compile(
    r"bad_records\.shard-\d+-of-\d+\.jsonl|lock\.shard-\d+-of-\d+|" + _TEMPORARY.pattern
)
_MARKER = re.compile(r"part-\d{5,}-\d{6,}\.json")

# Fingerprint keys, as the user knows them.
_SETTING_NAMES = {
    "model": "--model",
    "model_version": "the model's weights",
    "family": "model family",
    "outputs": "--outputs",
    "pooling": "--pooling",
    "normalize": "--normalize",
    "max_length": "--max-length",
    "prompt": "--prompt",
    "lowercase": "lowercasing",
    "dtype": "--dtype",
    "dim": "--dim",
    "dtype_out": "--dtype-out",
    "quantize": "--quantize",
    "sparse_top_k": "--sparse-top-k",
    "text_column": "--text-column",
    "id_column": "--id-column",
    "limit": "--limit",
    "inputs": "the inputs",
    "keep_columns": "--keep-columns",
    "since": "--since",
}


class LockedError(BulkembedError):
    """Another live run holds the output."""


@dataclass(frozen=True, slots=True)
class UnitRecord:
    """What a committed unit of work holds; the content of its done-marker.

    `carried` rows were copied from a previous output (`--since`), `changed` of them or of
    the others had another text there; `version` is where the sink found the unit (a
    LanceDB table version)."""

    part: str
    rows: int
    bad_records: int
    truncated: int
    tokens: int
    padded_tokens: int
    carried: int = 0
    changed: int = 0
    version: int | None = field(default=None)


def _write_json_atomically(path: Path, data: dict[str, Any], exclusive: bool = False) -> bool:
    """Write `path` whole or not at all, through a temporary file of this writer's own (runs
    with `--shard` write the same files side by side). With `exclusive`, only if `path`
    does not exist yet: False if it did."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        with open(temporary, "w", encoding="utf-8") as f:
            f.write(json.dumps(data, indent=2, default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if not exclusive:
            os.replace(temporary, path)
            return True
        try:
            os.link(temporary, path)
            return True
        except FileExistsError:
            return False
        finally:
            temporary.unlink()
    except OSError as e:
        temporary.unlink(missing_ok=True)
        raise OutputError(f"cannot write {path}: {e}") from e


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise OutputError(f"cannot read {path}: {e}; the output is damaged, use --overwrite") from e


def _quarantine_line(fields: dict[str, Any], part: str) -> str:
    return json.dumps({**fields, "part": part}, default=str) + "\n"


def describe_changes(before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """One phrase per fingerprint setting that differs, e.g. `--max-length: 256 -> 128`."""
    changes = []
    for key in sorted(set(before) | set(now)):
        name = _SETTING_NAMES.get(key, key)
        if key == "inputs":
            change = _inputs_change(before.get(key) or [], now.get(key) or [])
            if change is not None:
                changes.append(f"{name} ({change})")
        elif before.get(key) != now.get(key):
            changes.append(f"{name}: {before.get(key)!r} -> {now.get(key)!r}")
    return changes


def _inputs_change(before: list[dict[str, Any]], now: list[dict[str, Any]]) -> str | None:
    """How the inputs differ, or None. An input is the same when its name and size are, and
    its content digest (`--verify-inputs`, when both runs took one), else its modification
    time."""
    if [(i["name"], i["size"]) for i in before] != [(i["name"], i["size"]) for i in now]:
        return "files added, removed or changed in size"
    for old, new in zip(before, now, strict=True):
        if "content" in old and "content" in new:
            if old["content"] != new["content"]:
                return f"{new['name']} changed in content"
        elif old.get("modified") != new.get("modified"):
            return (
                f"{new['name']} was modified after the output was started; a run started with "
                "--verify-inputs compares contents instead of times"
            )
    return None


class RunDirectory:
    """The bookkeeping of a run: by default in `OUT/_bulkembed/`, next to the Parquet parts.

    `label` names the output in messages (default: `output`)."""

    def __init__(
        self,
        output: Path,
        meta: Path | None = None,
        label: str | None = None,
        shard: ShardSpec | None = None,
    ) -> None:
        self.output = output
        self.label = label or str(output)
        self.meta = meta or output / RUN_DIRECTORY
        self.shard = shard
        self.done_dir = self.meta / "done"
        self.config_path = self.meta / CONFIG_FILE
        self.summary_path = self.meta / "summary.json"
        self.lock_path = self.meta / "lock"
        self.complete_path = self.meta / "complete"
        self.bad_records_path = self.meta / "bad_records.jsonl"
        self.shards_path = self.meta / "shards.json"
        if shard is not None:
            name = f"shard-{shard.index}-of-{shard.count}"
            self.bad_records_path = self.meta / f"bad_records.{name}.jsonl"
            self.shard_lock_path = self.meta / f"lock.{name}"
        self._locks: list[IO[str]] = []
        self._run_id: str | None = None
        # What `reconcile` found and mended, one line each, for the run to report.
        self.repairs: list[str] = []

    # Opening, locking, starting over.

    def open(
        self,
        fingerprint: dict[str, Any],
        overwrite: bool,
        sink: Sink,
        parts: Collection[str] | None = None,
    ) -> dict[str, UnitRecord]:
        """Lock the directory and make it and `sink` ready to run `fingerprint`; return the
        done units (of every run that shares the output).

        A directory holding a run with another fingerprint is refused unless `overwrite`,
        which removes bulkembed's own files from it and from the sink, and nothing else.
        With `parts` (the units of a `--shard` run) only what those units left half-done
        is cleaned up: other shards may be running.
        """
        fresh = not self.config_path.exists()
        marked = self._marker_parts()
        if fresh and marked and not overwrite:
            start_over = "remove the output" if self.shard else "pass --overwrite"
            raise OutputError(
                f"{self.config_path} is missing but {len(marked)} unit(s) are marked done: "
                f"the settings they were embedded with are unknown; {start_over} to start over"
            )
        if fresh and not marked:
            # With markers, the ledger shows what bulkembed wrote there.
            sink.check_foreign(overwrite)
        try:
            self.meta.mkdir(parents=True, exist_ok=True)
            self.acquire_lock()
        except OSError as e:
            raise OutputError(
                f"cannot write to {self.label}: {e.strerror or e}; choose another --output"
            ) from e
        try:
            if overwrite:
                sink.remove(marked)
                self._remove_previous()
            elif self.shard is not None:
                self._join_shards(fingerprint)
            elif not fresh:
                self._check_fingerprint(fingerprint)
            if self.config_path.exists():
                self._run_id = self.read_config().get("run")
            self._run_id = self._run_id or secrets.token_hex(8)
            self.done_dir.mkdir(exist_ok=True)
            return self.reconcile(sink, parts)
        except BaseException:
            self.release_lock()
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

    def _join_shards(self, fingerprint: dict[str, Any]) -> None:
        """The first `--shard` run to start fixes the settings and N, atomically; the others
        must match both."""
        assert self.shard is not None
        claim = {"fingerprint": fingerprint, "run": secrets.token_hex(8)}
        if not _write_json_atomically(self.config_path, claim, exclusive=True):
            self._check_fingerprint(fingerprint)
        count = {"count": self.shard.count}
        if not _write_json_atomically(self.shards_path, count, exclusive=True):
            before = _read_json(self.shards_path).get("count")
            if before != self.shard.count:
                raise OutputError(
                    f"{self.label} is shared out among runs with --shard I/{before}: pass the "
                    "same N, or remove the output to start over with another"
                )

    def _check_fingerprint(self, fingerprint: dict[str, Any]) -> None:
        before = _read_json(self.config_path).get("fingerprint", {})
        changes = describe_changes(before, fingerprint)
        if changes:
            raise OutputError(
                f"{self.label} holds a run with other settings ({'; '.join(changes)}): "
                "pass --overwrite to start over, or choose another --output"
            )

    def acquire_lock(self) -> None:
        """Hold the directory for as long as this process lives: a whole run holds `lock`
        exclusively; a `--shard` run holds it shared, and its own `lock.shard-I-of-N`
        exclusively, so that shards run side by side but each only once.

        Locks are `flock`s: the kernel drops them when their holder dies, however it dies, so
        a stale lock is simply taken over.
        """
        if self.shard is None:
            self._locks.append(self._lock(self.lock_path, fcntl.LOCK_EX))
            return
        self._locks.append(self._lock(self.lock_path, fcntl.LOCK_SH))
        try:
            self._locks.append(self._lock(self.shard_lock_path, fcntl.LOCK_EX))
        except BaseException:
            self.release_lock()
            raise

    def _lock(self, path: Path, mode: int) -> IO[str]:
        lock = open(path, "a+", encoding="utf-8")  # noqa: SIM115 (held until release)
        for attempt in range(LOCK_ATTEMPTS):
            try:
                fcntl.flock(lock, mode | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                # A run that is just starting, or `bulkembed status` looking, holds it briefly.
                if attempt + 1 < LOCK_ATTEMPTS:
                    time.sleep(LOCK_RETRY_SECONDS)
                    continue
                lock.seek(0)
                holder = lock.read().strip() or "runs with --shard"
                lock.close()
                which = "" if path == self.lock_path else f"shard {self.shard.label} of "
                raise LockedError(
                    f"{which}{self.label} is in use by a running bulkembed ({holder}); "
                    "wait for it to finish or stop it, or choose another --output"
                ) from None
        # No exclusive holder is alive now: a name in the file is a dead run's.
        lock.seek(0)
        lock.truncate()
        if mode == fcntl.LOCK_EX:
            lock.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
            lock.flush()
        return lock

    def release_lock(self) -> None:
        """Drop the locks; an exclusive holder first erases its name from the file."""
        for lock in reversed(self._locks):
            if lock.name != str(self.lock_path) or self.shard is None:
                lock.truncate(0)
            fcntl.flock(lock, fcntl.LOCK_UN)
            lock.close()
        self._locks.clear()

    def lock_holder(self) -> str | None:
        """Who holds the lock now (`pid N on HOST`, or shard runs), or None if no live run
        does."""
        if not self.lock_path.exists():
            return None
        # Opened for writing: on NFS an exclusive lock needs it.
        with open(self.lock_path, "a+", encoding="utf-8") as lock:
            lock.seek(0)
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return lock.read().strip() or "runs with --shard"
            fcntl.flock(lock, fcntl.LOCK_UN)
        return None

    def _remove_previous(self) -> None:
        """Delete the bookkeeping (the sink has removed the rows): the files bulkembed
        writes here, by name, and nothing else. The ledger goes first and the configuration
        last, so an interrupted removal leaves a state the next run checks and reconciles
        like any other."""
        if self.done_dir.is_dir():
            for path in self.done_dir.iterdir():
                if _MARKER.fullmatch(path.name) or _TEMPORARY.fullmatch(path.name):
                    path.unlink()
        for path in self.meta.iterdir():
            own = path.name in _OWN_FILES or _OWN_NAMES.fullmatch(path.name)
            if own and path.is_file() and path != self.lock_path:
                path.unlink()
        self.config_path.unlink(missing_ok=True)

    # The ledger.

    def _marker(self, part: str) -> Path:
        return self.done_dir / f"{part}.json"

    def _marker_parts(self) -> list[str]:
        """The parts that have a marker file, readable or not."""
        if not self.done_dir.is_dir():
            return []
        return sorted(p.stem for p in self.done_dir.iterdir() if _MARKER.fullmatch(p.name))

    def _read_marker(self, part: str) -> dict[str, Any] | None:
        """A marker's content; None for one that is damaged (cut short, edited)."""
        try:
            fields = json.loads(self._marker(part).read_text(encoding="utf-8"))
            UnitRecord(**{k: v for k, v in fields.items() if k != "bad"})
        except (OSError, ValueError, TypeError):
            return None
        return fields

    def done_units(self) -> dict[str, UnitRecord]:
        """Every committed unit, by part name; a damaged marker counts as none."""
        return self._markers()[0]

    def _markers(self) -> tuple[dict[str, UnitRecord], list[str]]:
        """The committed units, and the parts whose marker is damaged, in one pass."""
        done, damaged = {}, []
        for part in self._marker_parts():
            fields = self._read_marker(part)
            if fields is None:
                damaged.append(part)
            else:
                fields.pop("bad", None)
                done[part] = UnitRecord(**fields)
        return done, damaged

    def reconcile(self, sink: Sink, parts: Collection[str] | None = None) -> dict[str, UnitRecord]:
        """Drop what a crash left half-done, here and in the sink (only in `parts`, when
        given); take back parts whose marker was lost and forget units whose rows are gone,
        noting each in `repairs`; return the done units."""
        temporaries = list(self.done_dir.glob(".*.tmp"))
        if parts is None:
            temporaries += self.meta.glob(".*.tmp")
        for path in temporaries:
            ours = _TEMPORARY.fullmatch(path.name)
            if ours and (parts is None or path.name[1:].split(".")[0] in parts):
                path.unlink(missing_ok=True)
        done, damaged = self._markers()
        recovered = sink.reconcile(done, self.run_id, parts)
        for fields in recovered.adopted:
            bad = fields.pop("bad", [])
            record = UnitRecord(**fields)
            self.mark_done(record, bad)
            done[record.part] = record
            self.repairs.append(
                f"{record.part}: its done-marker was missing or damaged; the part is complete "
                "and was written by this run, so it is kept"
            )
        forgotten = [p for p in damaged if p not in done and (parts is None or p in parts)]
        for part in forgotten:
            self._marker(part).unlink(missing_ok=True)
            self.repairs.append(f"{part}: its done-marker is damaged; embedding the unit again")
        for part in recovered.lost:
            self._marker(part).unlink(missing_ok=True)
            del done[part]
            self.repairs.append(
                f"{part}: its rows are missing from {sink.description} although the unit was "
                "marked done; embedding the unit again"
            )
        # Other shards may be marking units done meanwhile: a shard run takes `complete` back
        # only for units of its own that it forgot.
        if forgotten or recovered.lost or (parts is None and not self.is_complete(done)):
            self.complete_path.unlink(missing_ok=True)
        self.rebuild_quarantine(done, parts)
        return done

    def mark_done(self, record: UnitRecord, bad: list[dict[str, Any]]) -> None:
        """Record a unit, with its bad records, as committed; call only once its part is in
        place."""
        _write_json_atomically(self._marker(record.part), {**asdict(record), "bad": bad})

    def mark_complete(self, units: int) -> None:
        """Every unit of the inputs is done: there are `units` of them."""
        _write_json_atomically(self.complete_path, {"units": units})

    def is_complete(self, done: Collection[str] | None = None) -> bool:
        """Whether every unit is done; with `done`, whether they all still are (as many as
        when the run was marked complete)."""
        if not self.complete_path.exists():
            return False
        if done is None:
            return True
        try:
            return len(done) >= json.loads(self.complete_path.read_text(encoding="utf-8"))["units"]
        except (OSError, ValueError, KeyError, TypeError):
            return False

    # Quarantine.

    def quarantine(self, bad: list[dict[str, Any]], part: str) -> None:
        """Append the bad records of unit `part` to the quarantine file, in one write
        (processes that share the file append whole lines)."""
        if not bad:
            return
        try:
            with open(self.bad_records_path, "a", encoding="utf-8") as f:
                f.write("".join(_quarantine_line(fields, part) for fields in bad))
        except OSError as e:
            raise OutputError(f"cannot write {self.bad_records_path}: {e}") from e

    def rebuild_quarantine(
        self, done: dict[str, UnitRecord], parts: Collection[str] | None = None
    ) -> None:
        """Write the quarantine file anew from the markers of the done units (of `parts`
        only, when given), in unit order, one marker in memory at a time. A whole run on an
        output that `--shard` runs wrote leaves their quarantine files as they are."""
        if parts is None and self.shards_path.exists():
            return
        mine = sorted(p for p, r in done.items() if r.bad_records and (parts is None or p in parts))
        if not mine:
            self.bad_records_path.unlink(missing_ok=True)
            return
        temporary = self.bad_records_path.with_name(f".{self.bad_records_path.name}.tmp")
        try:
            with open(temporary, "w", encoding="utf-8") as f:
                for part in mine:
                    fields = self._read_marker(part) or {}
                    f.write("".join(_quarantine_line(b, part) for b in fields.get("bad", [])))
            os.replace(temporary, self.bad_records_path)
        except OSError as e:
            with contextlib.suppress(OSError):
                temporary.unlink()
            raise OutputError(f"cannot write {self.bad_records_path}: {e}") from e

    # Configuration and summary.

    def read_config(self) -> dict[str, Any]:
        return _read_json(self.config_path)

    def write_config(self, config: dict[str, Any]) -> None:
        _write_json_atomically(self.config_path, {**config, "run": self.run_id})

    def write_summary(self, summary: dict[str, Any]) -> None:
        _write_json_atomically(self.summary_path, summary)

    def write_vocabulary(self, vocabulary: dict[str, str]) -> None:
        _write_json_atomically(self.meta / "vocab.json", vocabulary)

    @property
    def quantization_path(self) -> Path:
        return self.meta / "quantization.json"

    def read_quantization_ranges(self) -> list[list[float]] | None:
        """The int8/uint8 ranges ([min per dimension, max per dimension]) of this run."""
        if not self.quantization_path.exists():
            return None
        return _read_json(self.quantization_path)["ranges"]

    def write_quantization_ranges(self, precision: str, ranges: list[list[float]]) -> None:
        _write_json_atomically(self.quantization_path, {"precision": precision, "ranges": ranges})


def run_status(run: RunDirectory, sink: Sink) -> dict[str, Any]:
    """Where a run directory stands: units done and pending, documents, bad records, lock.
    Units whose rows are gone from `sink` count as pending, whatever the ledger says."""
    from bulkembed.sources import Shard, unit_names
    from bulkembed.sources.files import format_of

    if not run.config_path.exists():
        raise OutputError(f"{run.label} holds no bulkembed run ({run.config_path} is missing)")
    config = run.read_config()
    done = run.done_units()
    lost = sink.lost_units(done)
    for part in lost:
        del done[part]
    inputs = config.get("input_paths", [])
    sizes = {i["name"]: i["size"] for i in config.get("fingerprint", {}).get("inputs", [])}
    shards = [
        Shard(Path(i["path"]), i["name"], format_of(Path(i["path"])) or "", sizes[i["name"]])
        for i in inputs
    ]
    holder = run.lock_holder()
    if run.is_complete(done):
        state, pending = "complete", 0
    else:
        readable = all(s.path.is_file() for s in shards)
        pending = len(set(unit_names(shards)) - set(done)) if readable else None
        state = f"running ({holder})" if holder else "stopped: run the same command to resume"
    settings = ("model", "recipe", "pooling", "normalize", "max_length", "dtype", "device")
    return {
        "output": run.label,
        "state": state,
        "units_done": len(done),
        "units_pending": pending,
        "docs": sum(r.rows for r in done.values()),
        "bad_records": sum(r.bad_records for r in done.values()),
        "truncated": sum(r.truncated for r in done.values()),
        "inputs": len(shards),
        "lock": holder,
        **{key: config.get(key) for key in settings},
    }

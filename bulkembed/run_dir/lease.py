"""The lock of a run directory on object storage: a lease object.

Object stores have no `flock`. A run holds `_bulkembed/lease` (a `--shard` run:
`lease.shard-I-of-N`), an object naming its holder and the time it expires. It is created
with a conditional write that fails if the object exists (S3's `If-None-Match: *`), renewed
by a heartbeat thread every quarter of its term with a write conditional on the entity tag
the holder last wrote (`If-Match`), and deleted, on the same condition, when the run ends.

- A live lease (not expired) refuses a second run of the same output, or of the same shard;
  a whole run and shard runs refuse each other.
- A lease that has expired (its holder died without deleting it), or whose holder was a
  process of this machine that is gone, is taken over, with a write conditional on the
  old lease's entity tag, so that of two runs taking it over at once only one wins.
  `--break-lock` takes over a lease that has not expired; a holder renewing between the
  takeover's read and its write is read again (`TAKE_OVER_TRIES`), another run's token
  ends it.
- A holder stops before it commits or marks another unit (`check`, and `LeaseFence` in the
  processes that commit units beside it) when another run took its lease (both read the
  lease object), or when its last renewal is older than the term less `FENCE_MARGIN` (it
  may have expired by another run's clock). Only a run frozen between that read and its
  commit, a moment, is not covered.

On stores without conditional writes (GCS and Azure here) the create and the renewal are a
check followed by a write: two runs started within the same second may both start.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from bulkembed.errors import BulkembedError, OutputLocked
from bulkembed.run_dir.lock import LockedError, RunLock
from bulkembed.storage import ABSENT, AnyPath, ObjectPath, process_alive

if TYPE_CHECKING:
    from bulkembed.config import ShardSpec

# How long a lease lasts without renewal (BULKEMBED_LEASE_SECONDS): a dead run's output is
# free again after this long.
LEASE_SECONDS = 60.0
# A holder commits a unit only while its lease has this share of its term left.
FENCE_MARGIN = 0.25
# Seconds ahead past which a lease's expiry is shown as a date: no renewal sets it so far.
FARTHEST_EXPIRY = 86_400
# Reads and conditional writes a takeover tries while the holder it replaces renews.
TAKE_OVER_TRIES = 5


def lease_seconds() -> float:
    return float(os.environ.get("BULKEMBED_LEASE_SECONDS", LEASE_SECONDS))


def _pid_namespace() -> int | None:
    """This process's PID namespace: containers that share a host name do not share it."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def _expires(fields: dict[str, Any]) -> float:
    try:
        return float(fields.get("expires", 0))
    except (TypeError, ValueError):
        return 0.0


def _read(path: ObjectPath) -> tuple[dict[str, Any], str | None] | None:
    """A lease's fields and entity tag; None if there is none. A damaged one has no fields,
    and so has expired."""
    found = path.read_versioned()
    if found is None:
        return None
    data, version = found
    try:
        fields = json.loads(data)
    except ValueError:
        fields = {}
    return (fields if isinstance(fields, dict) else {}), version


@dataclass(frozen=True, slots=True)
class LeaseFence:
    """What a process that commits units for a lease holder (a device process, a Ray actor)
    checks before each commit: that the lease at `path` is still the holder's (`token`) and
    has at least `FENCE_MARGIN` of its term left."""

    path: ObjectPath
    token: str
    label: str

    def __call__(self) -> None:
        found = _read(self.path)
        fields = found[0] if found is not None else {}
        if fields.get("token") != self.token:
            raise LeaseLost(
                f"{self.label}: its lease {self.path} was taken over by another run; this run "
                "stops here"
            )
        if _expires(fields) - time.time() < FENCE_MARGIN * lease_seconds():
            raise LeaseLost(
                f"{self.label}: its lease {self.path} was not renewed in time; this run stops here"
            )


class LeaseLost(OutputLocked):
    """Another run took this run's lease, or it was not renewed in time: it must stop
    writing (and may run again later)."""


class ObjectLease:
    """The lease of run directory `meta` on object storage (see the module docstring)."""

    def __init__(
        self, meta: ObjectPath, label: str, shard: ShardSpec | None, take_over: bool = False
    ) -> None:
        self.label = label
        self.shard = shard
        self.take_over = take_over
        self.lock_path = meta / "lease"
        self.meta = meta
        self.path = self.lock_path
        if shard is not None:
            self.path = meta / f"lease.shard-{shard.index}-of-{shard.count}"
        self.token = secrets.token_hex(8)
        self.holder_name = f"pid {os.getpid()} on {socket.gethostname()}"
        self._version: str | None = None
        self._renewed = 0.0
        self._stop = threading.Event()
        self._lost: str | None = None
        self._thread: threading.Thread | None = None
        self._guard = threading.Lock()

    def _body(self) -> bytes:
        expires = time.time() + lease_seconds()
        shard = None if self.shard is None else self.shard.label
        fields = {"holder": self.holder_name, "token": self.token, "expires": expires}
        place = {"host": socket.gethostname(), "pid": os.getpid(), "pidns": _pid_namespace()}
        return json.dumps({**fields, **place, "shard": shard}).encode()

    @staticmethod
    def _live(fields: dict[str, Any]) -> bool:
        """Whether a lease holds: not expired, and not a process of this machine (same host
        name and PID namespace) that is gone."""
        if _expires(fields) <= time.time():
            return False
        here = (socket.gethostname(), _pid_namespace())
        if (fields.get("host"), fields.get("pidns")) != here or here[1] is None:
            return True
        pid = fields.get("pid")
        return not isinstance(pid, int) or process_alive(pid)

    def acquire(self) -> None:
        """Hold the lease, or raise `LockedError` naming who does."""
        self._version = self.path.write_if(self._body(), ABSENT)
        if self._version is None:
            self._version = self._take_over()
        self._renewed = time.monotonic()
        try:
            self._refuse_the_other_kind()
        except BaseException:
            self.release()
            raise
        self._thread = threading.Thread(target=self._renew, name="bulkembed-lease", daemon=True)
        self._thread.start()

    def _take_over(self) -> str:
        """Write over a lease that has expired, whose holder is gone, or (`--break-lock`)
        any lease. A holder renewing between the read and the write (its token, a new
        entity tag) is read again; another token than the one first read means another
        run took the lease first."""
        first: str | None = None
        for _ in range(TAKE_OVER_TRIES):
            found = _read(self.path)
            if found is None:
                version = self.path.write_if(self._body(), ABSENT)
            else:
                fields, tag = found
                token = str(fields.get("token"))
                if first is not None and token != first:
                    break
                if self._live(fields) and not self.take_over:
                    raise self._locked(fields, self.shard)
                first = token
                version = self.path.write_if(self._body(), tag)
            if version is not None:
                return version
        raise LockedError(
            f"{self.label} was taken by another bulkembed starting at the same time; "
            "wait for it to finish or stop it, or choose another --output"
        )

    def _refuse_the_other_kind(self) -> None:
        """A whole run refuses live shard leases; a shard run refuses a live whole lease
        (`--break-lock` takes over this run's own lease only)."""
        whole = self.shard is None
        others = list(self.meta.glob("lease.shard-*")) if whole else [self.lock_path]
        for other in others:
            found = _read(other)
            if found is not None and self._live(found[0]):
                raise self._locked(found[0], None)

    def _locked(self, fields: dict[str, Any], shard: ShardSpec | None) -> LockedError:
        which = "" if shard is None else f"shard {shard.label} of "
        holder = fields.get("holder", "another run")
        if fields.get("shard"):
            holder = f"{holder}, shard {fields['shard']}"
        expires = _expires(fields)
        left = max(0, round(expires - time.time()))
        when = f"expires in {left} s unless renewed"
        if left > FARTHEST_EXPIRY:
            day = datetime.fromtimestamp(expires, timezone.utc).strftime("%Y-%m-%d %H:%M")
            when = f"runs until {day} UTC, further ahead than any renewal sets it"
        return LockedError(
            f"{which}{self.label} is in use by a running bulkembed ({holder}; its lease "
            f"{when}); wait for it to finish or stop it, or pass --break-lock if that run is "
            "dead"
        )

    def _renew(self) -> None:
        interval = lease_seconds() / 4
        while not self._stop.wait(interval):
            with self._guard:
                if self._stop.is_set():
                    return
                try:
                    version = self.path.write_if(self._body(), self._version)
                    if version is None:
                        # Another writer's request in flight (S3 answers 409) or a takeover:
                        # the lease says which.
                        found = _read(self.path)
                        if found is None or found[0].get("token") != self.token:
                            self._lost = f"its lease {self.path} was taken over by another run"
                            return
                        version = found[1]
                except BulkembedError:
                    # A passing failure: the next renewal may go through before expiry, and
                    # `check` stops the run if none does.
                    continue
                self._version = version
                self._renewed = time.monotonic()

    def check(self) -> None:
        """Raise `LeaseLost` if another run took the lease, or if it was last renewed so
        long ago that it may have expired by another run's clock. The lease object itself
        is read: a run frozen for a while (SIGSTOP, a paused container) may find it taken
        although its own renewals seem recent. A lease this process does not hold (a Ray
        actor's view of the run directory) has nothing to check."""
        if self._thread is None:
            return
        if self._lost is not None:
            raise LeaseLost(f"{self.label}: {self._lost}; this run stops here")
        if time.monotonic() - self._renewed > (1 - FENCE_MARGIN) * lease_seconds():
            raise LeaseLost(
                f"{self.label}: its lease {self.path} could not be renewed in time; this run "
                "stops here"
            )
        found = _read(self.path)
        if found is None or (found[1] != self._version and found[0].get("token") != self.token):
            self._lost = f"its lease {self.path} was taken over by another run"
            raise LeaseLost(f"{self.label}: {self._lost}; this run stops here")

    def fence(self) -> LeaseFence:
        """The check for the processes that commit units for this run."""
        return LeaseFence(self.path, self.token, self.label)

    def release(self) -> None:
        """Stop renewing and delete the lease, if it is still this run's."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        with self._guard:
            if self._version is not None and self._lost is None:
                self.path.delete_if(self._version)
            self._version = None

    def holder(self) -> str | None:
        """Who holds the output now, or None if no live lease does."""
        found = _read(self.lock_path)
        if found is not None and self._live(found[0]):
            return str(found[0].get("holder", "another run"))
        shards = [_read(p) for p in self.meta.glob("lease.shard-*")]
        live = [f[0] for f in shards if f is not None and self._live(f[0])]
        if live:
            return f"runs with --shard ({', '.join(str(f.get('holder')) for f in live)})"
        return None


def directory_lock(
    meta: AnyPath, label: str, shard: ShardSpec | None, take_over: bool = False
) -> RunLock | ObjectLease:
    """The lock of a run directory: a lease on object storage, a `flock` on a disk."""
    if isinstance(meta, ObjectPath):
        return ObjectLease(meta, label, shard, take_over)
    return RunLock(meta, label, shard)

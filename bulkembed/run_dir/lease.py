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
  `--break-lock` takes over a lease that has not expired.
- A holder whose renewal fails (another run broke its lease) stops before it marks another
  unit done (`check`).

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
from typing import TYPE_CHECKING, Any

from bulkembed.errors import BulkembedError, OutputError
from bulkembed.run_dir.lock import LockedError, RunLock
from bulkembed.storage import ABSENT, AnyPath, ObjectPath

if TYPE_CHECKING:
    from bulkembed.config import ShardSpec

# How long a lease lasts without renewal (BULKEMBED_LEASE_SECONDS): a dead run's output is
# free again after this long.
LEASE_SECONDS = 60.0


def lease_seconds() -> float:
    return float(os.environ.get("BULKEMBED_LEASE_SECONDS", LEASE_SECONDS))


class LeaseLost(OutputError):
    """Another run took this run's lease: it must stop writing."""


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
        self._stop = threading.Event()
        self._lost: str | None = None
        self._thread: threading.Thread | None = None
        self._guard = threading.Lock()

    def _body(self) -> bytes:
        expires = time.time() + lease_seconds()
        shard = None if self.shard is None else self.shard.label
        fields = {"holder": self.holder_name, "token": self.token, "expires": expires}
        place = {"host": socket.gethostname(), "pid": os.getpid()}
        return json.dumps({**fields, **place, "shard": shard}).encode()

    @staticmethod
    def _read(path: ObjectPath) -> tuple[dict[str, Any], str | None] | None:
        found = path.read_versioned()
        if found is None:
            return None
        data, version = found
        try:
            fields = json.loads(data)
        except ValueError:
            fields = {}
        return (fields if isinstance(fields, dict) else {}), version

    @staticmethod
    def _live(fields: dict[str, Any]) -> bool:
        """Whether a lease holds: not expired, and not a process of this machine that is
        gone."""
        if float(fields.get("expires", 0)) <= time.time():
            return False
        if fields.get("host") != socket.gethostname() or not isinstance(fields.get("pid"), int):
            return True
        try:
            os.kill(fields["pid"], 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def acquire(self) -> None:
        """Hold the lease, or raise `LockedError` naming who does."""
        self._version = self.path.write_if(self._body(), ABSENT)
        if self._version is None:
            found = self._read(self.path)
            if found is not None:
                fields, version = found
                if self._live(fields) and not self.take_over:
                    raise self._locked(fields, self.shard)
                self._version = self.path.write_if(self._body(), version)
            else:
                self._version = self.path.write_if(self._body(), ABSENT)
            if self._version is None:
                raise LockedError(
                    f"{self.label} was taken by another bulkembed starting at the same time; "
                    "wait for it to finish or stop it, or choose another --output"
                )
        try:
            self._refuse_the_other_kind()
        except BaseException:
            self.release()
            raise
        self._thread = threading.Thread(target=self._renew, name="bulkembed-lease", daemon=True)
        self._thread.start()

    def _refuse_the_other_kind(self) -> None:
        """A whole run refuses live shard leases; a shard run refuses a live whole lease."""
        whole = self.shard is None
        others = list(self.meta.glob("lease.shard-*")) if whole else [self.lock_path]
        for other in others:
            found = self._read(other)
            if found is not None and self._live(found[0]) and not self.take_over:
                raise self._locked(found[0], None)

    def _locked(self, fields: dict[str, Any], shard: ShardSpec | None) -> LockedError:
        which = "" if shard is None else f"shard {shard.label} of "
        holder = fields.get("holder", "another run")
        if fields.get("shard"):
            holder = f"{holder}, shard {fields['shard']}"
        left = max(0, round(float(fields.get("expires", 0)) - time.time()))
        return LockedError(
            f"{which}{self.label} is in use by a running bulkembed ({holder}; its lease "
            f"expires in {left} s unless renewed); wait for it to finish or stop it, or pass "
            "--break-lock if that run is dead"
        )

    def _renew(self) -> None:
        interval = lease_seconds() / 4
        while not self._stop.wait(interval):
            with self._guard:
                if self._stop.is_set():
                    return
                try:
                    version = self.path.write_if(self._body(), self._version)
                except BulkembedError:
                    # A passing failure: the next renewal may go through before expiry.
                    continue
                if version is None:
                    self._lost = f"its lease {self.path} was taken over by another run"
                    return
                self._version = version

    def check(self) -> None:
        """Raise `LeaseLost` if another run took the lease."""
        if self._lost is not None:
            raise LeaseLost(f"{self.label}: {self._lost}; this run stops here")

    def release(self) -> None:
        """Stop renewing and delete the lease, if it is still this run's."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._guard:
            if self._version is not None and self._lost is None:
                self.path.delete_if(self._version)
            self._version = None

    def holder(self) -> str | None:
        """Who holds the output now, or None if no live lease does."""
        found = self._read(self.lock_path)
        if found is not None and self._live(found[0]):
            return str(found[0].get("holder", "another run"))
        shards = [self._read(p) for p in self.meta.glob("lease.shard-*")]
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

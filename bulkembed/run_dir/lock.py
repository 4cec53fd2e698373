"""The lock of a run directory: one run at a time per output, or per `--shard`.

Locks are `flock`s: the kernel drops them when their holder dies, however it dies, so a
stale lock is simply taken over.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING

from bulkembed.errors import OutputLocked

if TYPE_CHECKING:
    from bulkembed.config import ShardSpec

LOCK_ATTEMPTS = 10
LOCK_RETRY_SECONDS = 0.1


def _nothing_to_check() -> None:
    """A `flock` is held for as long as its process lives."""


class LockedError(OutputLocked):
    """Another live run holds the output (its lock or its lease)."""


class RunLock:
    """The lock of the run directory `meta`; `label` names the output in messages."""

    def __init__(self, meta: Path, label: str, shard: ShardSpec | None) -> None:
        self.label = label
        self.shard = shard
        self.lock_path = meta / "lock"
        self.shard_lock_path: Path | None = None
        if shard is not None:
            self.shard_lock_path = meta / f"lock.shard-{shard.index}-of-{shard.count}"
        self._locks: list[IO[str]] = []

    def acquire(self) -> None:
        """Hold the directory for as long as this process lives: a whole run holds `lock`
        exclusively; a `--shard` run holds it shared, and its own `lock.shard-I-of-N`
        exclusively, so that shards run side by side but each only once."""
        if self.shard_lock_path is None:
            self._locks.append(self._lock(self.lock_path, fcntl.LOCK_EX))
            return
        self._locks.append(self._lock(self.lock_path, fcntl.LOCK_SH))
        try:
            self._locks.append(self._lock(self.shard_lock_path, fcntl.LOCK_EX))
        except BaseException:
            self.release()
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
                shard = None if path == self.lock_path else self.shard
                which = "" if shard is None else f"shard {shard.label} of "
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

    def check(self) -> None:
        """Nothing to check: a live holder's `flock` cannot be taken from it."""

    def fence(self) -> Callable[[], None]:
        """The check for the processes that commit units for this run: nothing to check."""
        return _nothing_to_check

    def release(self) -> None:
        """Drop the locks; an exclusive holder first erases its name from the file."""
        for lock in reversed(self._locks):
            if lock.name != str(self.lock_path) or self.shard is None:
                lock.truncate(0)
            fcntl.flock(lock, fcntl.LOCK_UN)
            lock.close()
        self._locks.clear()

    def holder(self) -> str | None:
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

"""Temporary folders and files of a run, owned by a lock rather than by a process id.

A run keeps some of its bookkeeping in the temporary directory: a stream's run directory,
a previous output's lookup (`scratch_folder`), the local copy of a part on its way to object
storage (`Spool`). A run killed before it could remove them leaves them behind, so each run
sweeps the leftovers of runs that are gone when it starts. A temporary directory may be
shared by runs that cannot see each other's processes (containers on one host sharing a
volume, a Kubernetes `emptyDir`, hosts sharing a network file system): a process id that is
not alive here says nothing about a run there. So the owner of each such path holds an OS
lock on it (`flock`, which the kernel, or the network file system's lock manager, keeps for
every process that shares the file) for as long as it lives, and the sweep removes only
what it can lock itself:

- a scratch folder holds the lock file `.lock`, locked from the moment the folder is made
  (a folder seen without one is one being made, or a folder of an earlier bulkembed: it is
  left alone, for the system's cleaning of its temporary directory);
- a spool file is locked itself while it is written and uploaded.

The lock is the open file's: it is released when the owner closes it (`remove_scratch`,
the spool's commit or discard) or dies, or, where the owner forked processes that still
hold the file open, once they are gone too; those processes may read the folder. Where
the system has no `flock` (Windows), nothing is locked and nothing is swept.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

if sys.platform != "win32":
    import fcntl

LOCK_FILE = ".lock"
# The lock of each scratch folder this process made and has not removed, by folder.
_HELD: dict[Path, int] = {}


def scratch_folder(kind: str) -> Path:
    """A new temporary folder of this process, `bulkembed-KIND-PID-...`, locked by it until
    `remove_scratch`; first, the folders of its kind whose owners are gone are removed."""
    for path in Path(tempfile.gettempdir()).glob(f"bulkembed-{kind}-*-*"):
        if path.is_dir():
            _remove_unheld(path)
    folder = Path(tempfile.mkdtemp(prefix=f"bulkembed-{kind}-{os.getpid()}-"))
    hidden = folder / f"{LOCK_FILE}.new"
    hidden.touch(mode=0o600)
    _HELD[folder] = locked_file(hidden, folder / LOCK_FILE)
    return folder


def remove_scratch(folder: Path) -> None:
    """Remove a folder of `scratch_folder`, then let go of its lock."""
    shutil.rmtree(folder, ignore_errors=True)
    held = _HELD.pop(folder, None)
    if held is not None:
        os.close(held)


def locked_file(hidden: Path, path: Path) -> int:
    """The file `hidden` (a name no sweep looks at, made already), locked by this process,
    then renamed `path`: no other process sees it unlocked. An open file descriptor that
    holds the lock until it is closed."""
    handle = os.open(hidden, os.O_RDWR)
    try:
        if sys.platform != "win32":
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.replace(hidden, path)
    except OSError:
        os.close(handle)
        raise
    return handle


def unheld(path: Path) -> int | None:
    """A descriptor of `path` locked by this process where no other process holds its lock
    (the caller removes what it guards, then closes it); None where one does, or where it
    cannot be opened or locked here."""
    if sys.platform == "win32":
        return None
    try:
        handle = os.open(path, os.O_RDWR)
    except OSError:
        return None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(handle)
        return None
    return handle


def _remove_unheld(folder: Path) -> None:
    """Remove `folder` if it has a lock file that no process holds."""
    handle = unheld(folder / LOCK_FILE)
    if handle is None:
        return
    try:
        shutil.rmtree(folder, ignore_errors=True)
    finally:
        os.close(handle)

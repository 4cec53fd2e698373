"""A cache of what bulkembed derives from a model once (its conversion to another runtime,
its tokenizer's facts): each in its own folder, found by a key.

A folder is `ROOT/KIND/DIGEST`, where DIGEST hashes the key (the model, its exact weights,
the converter's versions, bulkembed's version). It holds the converted files and a
`manifest.json`, written last, with the key and each file's size and SHA-256. A folder is
used only when its manifest names the same key and every file matches it: a corrupt file, a
folder of another revision, or a conversion stopped halfway is rebuilt.

A conversion is written into a temporary folder beside its place and renamed into it in one
step, so a reader never sees half a folder. Two processes converting at once each write
their own temporary folder; the first rename wins, and the other process checks and uses
the winner's folder. Nothing outside `ROOT` is touched, and inside it only folders whose
names this module gives. The cache only saves time: where it cannot be created or written
(a read-only home, a path under a file, a full disk), `converted` makes the conversion in a
temporary folder of its own, removed once it has been read.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import socket
import tempfile
import uuid
from collections.abc import Callable, Iterator
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from bulkembed.models.file_digests import cache_root
from bulkembed.storage import process_alive

MANIFEST = "manifest.json"
# Temporary and stale folders carry these prefixes: nothing else in a kind's folder is
# removed.
_BUILDING = ".building-"
_STALE = ".stale-"
_HASH_BLOCK = 1 << 22
# Why a folder cannot be written: no permission, a read-only or full disk, a file in the way.
_UNWRITABLE = frozenset(
    {
        errno.EACCES,
        errno.EPERM,
        errno.EROFS,
        errno.ENOSPC,
        errno.EDQUOT,
        errno.ENOTDIR,
        errno.EEXIST,
        errno.EISDIR,
    }
)


def installed_version(package: str) -> str | None:
    """The installed version of `package` (None: not installed), read without importing it:
    a cache key names the libraries that shaped what it holds."""
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def key_digest(key: dict[str, Any]) -> str:
    """The folder name of `key`: a digest of its JSON, keys sorted."""
    text = json.dumps(key, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _write_manifest(folder: Path, key: dict[str, Any]) -> None:
    files = {
        p.name: {"bytes": p.stat().st_size, "sha256": _file_digest(p)}
        for p in sorted(folder.iterdir())
        if p.is_file() and p.name != MANIFEST
    }
    manifest = folder / MANIFEST
    manifest.write_text(json.dumps({"key": key, "files": files}, indent=2), encoding="utf-8")
    with manifest.open("rb") as f:
        os.fsync(f.fileno())


def problem(folder: Path, key: dict[str, Any]) -> str | None:
    """Why `folder` cannot serve `key` (no manifest, another key, a file missing, cut short
    or changed), or None when every file matches the manifest."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        files = manifest["files"]
        stored_key = manifest["key"]
    except FileNotFoundError:
        return "no manifest (a conversion that did not finish)"
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"unreadable manifest ({e})"
    if stored_key != key:
        changed = sorted(k for k in set(key) | set(stored_key) if key.get(k) != stored_key.get(k))
        return f"made for another {', '.join(changed)}"
    if not files:
        return "no files"
    for name, expected in files.items():
        path = folder / name
        try:
            size = path.stat().st_size
        except OSError:
            return f"{name} is missing"
        if size != expected.get("bytes"):
            return f"{name} holds {size} bytes, not {expected.get('bytes')}"
        if _file_digest(path) != expected.get("sha256"):
            return f"{name} does not match its checksum"
    return None


def _remove(folder: Path) -> None:
    """Take `folder` out of the way in one rename, then delete it; another process may have
    done either first."""
    stale = folder.with_name(f"{_STALE}{folder.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        folder.rename(stale)
    except FileNotFoundError:
        return
    shutil.rmtree(stale, ignore_errors=True)


def _building_name(digest: str) -> str:
    return f"{_BUILDING}{digest}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _clear_abandoned(parent: Path, digest: str) -> None:
    """Remove the temporary folders of `digest` left by processes of this host that died
    while converting."""
    prefix = f"{_BUILDING}{digest}-{socket.gethostname()}-"
    for leftover in parent.glob(f"{_BUILDING}{digest}-*"):
        pid = leftover.name.removeprefix(prefix).split("-")[0]
        if leftover.name.startswith(prefix) and pid.isdigit() and not process_alive(int(pid)):
            shutil.rmtree(leftover, ignore_errors=True)


def cached(
    kind: str,
    key: dict[str, Any],
    build: Callable[[Path], None],
    rebuilt: Callable[[str], None] | None = None,
) -> Path:
    """The folder of `key` under `kind`, built by `build(folder)` (which writes the files
    into an empty folder) unless a valid one is there. `rebuilt(reason)` is told when a
    folder there was unusable and is replaced."""
    parent = cache_root() / kind
    folder = parent / key_digest(key)
    if folder.exists():
        reason = problem(folder, key)
        if reason is None:
            return folder
        if rebuilt is not None:
            rebuilt(reason)
        _remove(folder)
    parent.mkdir(parents=True, exist_ok=True)
    _clear_abandoned(parent, folder.name)
    building = parent / _building_name(folder.name)
    building.mkdir()
    try:
        build(building)
        _write_manifest(building, key)
        try:
            building.rename(folder)
        except OSError:
            # Another process renamed its conversion into place first.
            if problem(folder, key) is not None:
                raise
    finally:
        if building.exists():
            shutil.rmtree(building, ignore_errors=True)
    return folder


@contextlib.contextmanager
def converted(
    kind: str,
    key: dict[str, Any],
    build: Callable[[Path], None],
    rebuilt: Callable[[str], None] | None = None,
    unwritable: Callable[[str], None] | None = None,
) -> Iterator[Path]:
    """The folder of `key` under `kind` (`cached`), for as long as the `with` block reads
    it; where the cache cannot be written, a temporary folder that `build` writes into and
    that is removed afterwards (`unwritable(reason)` is told why)."""
    try:
        folder = cached(kind, key, build, rebuilt)
    except (OSError, RuntimeError) as e:
        # A converter raises RuntimeError when it cannot write its files; an OSError from
        # elsewhere (the model's download) is no matter of the cache.
        if isinstance(e, OSError) and e.errno not in _UNWRITABLE:
            raise
        reason = f"{cache_root()} cannot be written ({e})".splitlines()[0]
    else:
        yield folder
        return
    if unwritable is not None:
        unwritable(reason)
    with tempfile.TemporaryDirectory(prefix="bulkembed-convert-") as temporary:
        build(Path(temporary))
        yield Path(temporary)

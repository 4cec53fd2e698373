"""Digests of whole files, remembered per file so that an unchanged file is read once.

A model's version (`model_files.model_version`) is a digest of every byte of its files:
weights changed anywhere, with their size unchanged, give another version, and with it
another export-cache folder, run fingerprint and `load(OUTPUT)` check. Reading gigabytes
at every start would cost seconds, so each file's digest is remembered in bulkembed's cache
folder (`file-digests.json`), under its absolute path with its size, inode, device and
modification and change times (`st_ctime_ns` moves on any write and cannot be set back by
a user): a file whose stat matches costs a stat, one whose stat differs is read again. A
digest is remembered only for a file unchanged while it was read and last changed more
than `SETTLED_NS` before (a file system with coarse times could otherwise show a file
written again within the same tick as unchanged). A memo that is missing, damaged or
cannot be written only costs the reading.

A file's digest is SHA-256 (SHA-NI makes it about twice BLAKE2b's speed on x86) of its
content when it holds at most one piece of `PIECE` bytes; of a larger file, SHA-256 of the
SHA-256 digests of its pieces in order, so that the pieces of a file, and the files of a
folder, are read and hashed in parallel (hashlib lets go of the GIL).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

PIECE = 64 << 20
SETTLED_NS = 2_000_000_000
_BLOCK = 4 << 20
MEMO = "file-digests.json"


def cache_root() -> Path:
    """Where bulkembed caches what it derives once: `BULKEMBED_CACHE_DIR`, else
    `$XDG_CACHE_HOME/bulkembed`, else `~/.cache/bulkembed`."""
    configured = os.environ.get("BULKEMBED_CACHE_DIR")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "bulkembed"


def file_digests(paths: list[Path]) -> list[str]:
    """The SHA-256 digest (hex) of each file of `paths`, as the module's docstring says:
    remembered ones where the file's stat is unchanged, the others read, all their pieces
    at once on a pool of threads."""
    memo = _read_memo()
    stats = [_stat(path) for path in paths]
    found: list[str | None] = []
    for path, stat in zip(paths, stats, strict=True):
        entry = memo.get(str(path.resolve()))
        found.append(entry["sha256"] if entry and entry.get("stat") == stat else None)
    missing = [i for i, digest in enumerate(found) if digest is None]
    if missing:
        started = time.time_ns()
        computed = _computed([paths[i] for i in missing], [stats[i]["size"] for i in missing])
        for index, digest in zip(missing, computed, strict=True):
            found[index] = digest
            stat = stats[index]
            if _stat(paths[index]) == stat and stat["changed"] < started - SETTLED_NS:
                memo[str(paths[index].resolve())] = {"stat": stat, "sha256": digest}
        _write_memo(memo)
    return [digest for digest in found if digest is not None]


def _stat(path: Path) -> dict[str, int]:
    status = path.stat()
    return {
        "size": status.st_size,
        "inode": status.st_ino,
        "device": status.st_dev,
        "modified": status.st_mtime_ns,
        "changed": status.st_ctime_ns,
    }


def _computed(paths: list[Path], sizes: list[int]) -> list[str]:
    """The digests of `paths` (of `sizes` bytes), read now."""
    starts = [range(0, max(size, 1), PIECE) for size in sizes]
    pieces = [(path, start) for path, each in zip(paths, starts, strict=True) for start in each]
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        hashed = dict(zip(pieces, pool.map(_piece_digest, pieces), strict=True))
    digests = []
    for path, each in zip(paths, starts, strict=True):
        parts = [hashed[(path, start)] for start in each]
        if len(parts) == 1:
            digests.append(parts[0].hex())
        else:
            digests.append(hashlib.sha256(b"".join(parts)).hexdigest())
    return digests


def _piece_digest(piece: tuple[Path, int]) -> bytes:
    """SHA-256 of the `PIECE` bytes of a file from `start` (fewer at its end)."""
    path, start = piece
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(start)
        left = PIECE
        while left:
            block = f.read(min(_BLOCK, left))
            if not block:
                break
            digest.update(block)
            left -= len(block)
    return digest.digest()


def _read_memo() -> dict[str, Any]:
    try:
        memo = json.loads((cache_root() / MEMO).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return memo if isinstance(memo, dict) else {}


def _write_memo(memo: dict[str, Any]) -> None:
    """Write the memo whole or not at all, without the files that are gone; another
    process writing at once may win, which costs a reading, never a wrong digest."""
    kept = {path: entry for path, entry in memo.items() if os.path.exists(path)}
    folder = cache_root()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(prefix=f".{MEMO}.", dir=folder)
    except OSError:
        return
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as f:
            json.dump(kept, f)
        os.replace(name, folder / MEMO)
    except OSError:
        Path(name).unlink(missing_ok=True)

"""Where files live: a local path, or an object in object storage.

`location(text)` turns what a user wrote into a `Path` (a local path, or `file://PATH`) or an
`ObjectPath` (`s3://BUCKET/KEY`, `gs://BUCKET/KEY`, `az://CONTAINER/KEY`). An `ObjectPath`
answers the part of `pathlib.Path` that bulkembed uses (`/`, `name`, `exists`, `iterdir`,
`read_text`, `unlink`, ...) through `pyarrow.fs`, so the code above it reads the same for
both; what differs is said where it matters:

- object stores have no atomic rename: an object appears whole when its upload completes,
  and not before. `write_bytes` is one upload; a large file is written to a local spool
  file first and uploaded when complete (`upload`);
- there are no directories: a "directory" is a prefix that some object starts with;
- an exclusive create (`create`) is a conditional write where the store has one (S3's
  `If-None-Match: *`, through boto3), else a check followed by a write.

Credentials and endpoints come from each cloud's own environment variables and config
files (`AWS_ACCESS_KEY_ID`, `AWS_ENDPOINT_URL`, `~/.aws/config`, ...), and from
`--storage-option KEY=VALUE` (`StorageOptions`). Options are kept with every `ObjectPath`
(they travel with it to worker processes) and never written anywhere.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from bulkembed.errors import UsageError
from bulkembed.storage.objects import ABSENT, ObjectPath, PurePosix, stop_on_store_failure
from bulkembed.storage.scratch import locked_file, remove_scratch, scratch_folder, unheld
from bulkembed.storage.stores import (
    OPTION_KEYS,
    SCHEMES,
    FileStatus,
    StorageError,
    StorageOptions,
    filesystem,
    storage_error,
)

__all__ = [
    "ABSENT",
    "OPTION_KEYS",
    "SCHEMES",
    "AnyPath",
    "FileStatus",
    "ObjectPath",
    "PurePosix",
    "Spool",
    "StorageError",
    "StorageOptions",
    "filesystem",
    "is_uri",
    "location",
    "open_binary",
    "open_binary_at",
    "parquet_file",
    "process_alive",
    "random_access",
    "remove_scratch",
    "scratch_folder",
    "stop_on_store_failure",
    "storage_error",
]

FILE_SCHEME = "file://"
# What looks like a URI that `location` does not take (`hdfs://...`, `s3:/one-slash`): refused
# rather than made a local folder of that name. One letter before ':' is a drive (`C:/`).
_URI_LIKE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+:/")
# Bytes fetched per request by a buffered read of an object.
READ_BLOCK = 1 << 20

# A local path or an object.
AnyPath = Path | ObjectPath


def is_uri(text: str) -> bool:
    """Whether `text` names an object (or a `file://` path) rather than a plain path."""
    scheme, sep, _ = text.partition("://")
    return bool(sep) and (scheme in SCHEMES or scheme == "file")


def location(text: str, options: StorageOptions | None = None) -> AnyPath:
    """A path as the user wrote it: `s3://...`, `gs://...`, `az://...`, `file://...`, or a
    local path (`~` expanded)."""
    if text.startswith(FILE_SCHEME):
        return Path(text.removeprefix(FILE_SCHEME)).expanduser()
    scheme, sep, rest = text.partition("://")
    if sep and scheme in SCHEMES:
        if not rest.strip("/"):
            raise UsageError(f"{text}: name a bucket, as {scheme}://BUCKET/PREFIX")
        return ObjectPath(scheme, rest, options)
    mistyped = _URI_LIKE.match(text)
    if mistyped:
        known = ", ".join(f"{s}://" for s in sorted(SCHEMES)) + ", file://"
        raise UsageError(
            f"{text}: not a path or URI bulkembed reads or writes (write {known}, or a plain "
            "path; a URI needs '://' after its scheme)"
        )
    return Path(text).expanduser()


def open_binary(path: AnyPath) -> BinaryIO:
    """A file's bytes for reading from the start (local or remote), buffered: on object
    storage a request fetches `READ_BLOCK` bytes."""
    if isinstance(path, ObjectPath):
        return io.BufferedReader(path.open_stream(), READ_BLOCK)
    return open(path, "rb")


def open_binary_at(path: AnyPath, offset: int) -> BinaryIO:
    """A file's bytes from byte `offset` on (local or remote): on object storage, ranged
    requests from there, `READ_BLOCK` bytes each."""
    if isinstance(path, ObjectPath):
        f: BinaryIO = io.BufferedReader(path.open_input(), READ_BLOCK)
    else:
        f = open_binary(path)
    f.seek(offset)
    return f


@contextlib.contextmanager
def random_access(path: AnyPath) -> Iterator[Any]:
    """What pyarrow readers take: a local path as text, or a remote random-access file
    (closed after), whose reads are ranged requests."""
    if not isinstance(path, ObjectPath):
        yield str(path)
        return
    with path.open_input() as source:
        yield source


def parquet_file(path: AnyPath) -> Any:
    """A `pyarrow.parquet.ParquetFile` kept open by its reader: a remote one reads its
    footer, then only the column chunks asked for, in ranged requests. Pages written with a
    checksum are verified as they are read: a damaged one is an `OSError`, not other
    values."""
    import pyarrow.parquet as pq

    source = path.open_input() if isinstance(path, ObjectPath) else path
    return pq.ParquetFile(source, page_checksum_verification=True)


def process_alive(pid: int) -> bool:
    """Whether process `pid` of this machine (and PID namespace) is running."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(slots=True)
class Spool:
    """A local file that becomes an object when complete: written locally, then uploaded
    whole (`commit`), or dropped (`discard`); locked by this process until then, so that
    no other run's sweep takes it (`storage.scratch`)."""

    local: Path
    target: ObjectPath
    lock: int

    @classmethod
    def for_target(cls, target: ObjectPath) -> Spool:
        prefix = f"bulkembed-spool-{os.getpid()}-"
        handle, name = tempfile.mkstemp(prefix=f".{prefix}", suffix=f"-{target.name}")
        os.close(handle)
        hidden = Path(name)
        local = hidden.with_name(hidden.name[1:])
        return cls(local, target, locked_file(hidden, local))

    def commit(self) -> None:
        try:
            self.target.upload(self.local)
        finally:
            self.discard()

    def discard(self) -> None:
        self.local.unlink(missing_ok=True)
        if self.lock >= 0:
            os.close(self.lock)
            self.lock = -1

    @staticmethod
    def remove_left_by(pid: int) -> None:
        """Delete the spool files of process `pid` (one that died while writing)."""
        for path in Path(tempfile.gettempdir()).glob(f"bulkembed-spool-{pid}-*"):
            path.unlink(missing_ok=True)

    @staticmethod
    def remove_orphans() -> None:
        """Delete the spool files of runs that are gone (killed while they wrote parts): of
        processes not alive here whose lock no process holds (one of another PID namespace
        or host holds it)."""
        for path in Path(tempfile.gettempdir()).glob("bulkembed-spool-*-*"):
            pid = path.name.split("-")[2]
            if not pid.isdigit() or process_alive(int(pid)):
                continue
            handle = unheld(path)
            if handle is not None:
                path.unlink(missing_ok=True)
                os.close(handle)

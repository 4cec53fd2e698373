"""`ObjectPath`: an object in object storage, answering the part of `pathlib.Path` that
bulkembed uses through `pyarrow.fs` (see `bulkembed.storage`)."""

from __future__ import annotations

import fnmatch
import posixpath
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bulkembed.storage.s3 import CONDITION_FAILED, error_code, s3_client, s3_put
from bulkembed.storage.stores import (
    SCHEMES,
    STORE_FAILURES,
    FileStatus,
    StorageError,
    StorageOptions,
    filesystem,
    storage_error,
)

if TYPE_CHECKING:
    import pyarrow.fs as pafs

# `ObjectPath.write_if`'s condition for an object that must not exist yet.
ABSENT = "*"


class ObjectPath:
    """`SCHEME://BUCKET/KEY` in object storage, with the options to reach it."""

    __slots__ = ("scheme", "key", "options")

    def __init__(self, scheme: str, key: str, options: StorageOptions | None = None) -> None:
        self.scheme = scheme
        self.key = key.strip("/")
        self.options = options or StorageOptions()

    def __reduce__(self) -> tuple[Any, ...]:
        return (ObjectPath, (self.scheme, self.key, self.options))

    # Names.

    def __str__(self) -> str:
        return f"{self.scheme}://{self.key}"

    def __repr__(self) -> str:
        return f"ObjectPath({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectPath) and str(other) == str(self)

    def __hash__(self) -> int:
        return hash(str(self))

    def __lt__(self, other: ObjectPath) -> bool:
        return str(self) < str(other)

    def __truediv__(self, name: str) -> ObjectPath:
        return ObjectPath(self.scheme, posixpath.join(self.key, name), self.options)

    @property
    def bucket(self) -> str:
        return self.key.split("/", 1)[0]

    @property
    def name(self) -> str:
        return posixpath.basename(self.key)

    @property
    def suffix(self) -> str:
        return posixpath.splitext(self.name)[1]

    @property
    def stem(self) -> str:
        return posixpath.splitext(self.name)[0]

    @property
    def parent(self) -> ObjectPath:
        return ObjectPath(self.scheme, posixpath.dirname(self.key) or self.key, self.options)

    @property
    def parts(self) -> tuple[str, ...]:
        return tuple(self.key.split("/"))

    def with_name(self, name: str) -> ObjectPath:
        return self.parent / name

    def relative_to(self, other: ObjectPath) -> PurePosix:
        if not self.is_relative_to(other):
            raise ValueError(f"{self} is not below {other}")
        return PurePosix(self.key[len(other.key) :].lstrip("/"))

    def is_relative_to(self, other: object) -> bool:
        if not isinstance(other, ObjectPath) or other.scheme != self.scheme:
            return False
        return self.key == other.key or self.key.startswith(other.key + "/")

    def resolve(self) -> ObjectPath:
        return self

    def absolute(self) -> ObjectPath:
        return self

    def expanduser(self) -> ObjectPath:
        return self

    # Requests.

    @property
    def fs(self) -> pafs.FileSystem:
        return filesystem(SCHEMES[self.scheme], self.options)

    def _info(self) -> Any:
        try:
            return self.fs.get_file_info(self.key)
        except OSError as e:
            raise storage_error(str(self), e) from e

    def exists(self) -> bool:
        from pyarrow.fs import FileType

        return self._info().type != FileType.NotFound

    def is_file(self) -> bool:
        from pyarrow.fs import FileType

        return self._info().type == FileType.File

    def is_dir(self) -> bool:
        from pyarrow.fs import FileType

        return self._info().type == FileType.Directory

    def stat(self) -> FileStatus:
        info = self._info()
        if info.size is None:
            raise FileNotFoundError(str(self))
        modified = info.mtime_ns if info.mtime_ns is not None else 0
        return FileStatus(info.size, modified)

    def listing(self, recursive: bool = False) -> list[tuple[ObjectPath, bool]]:
        """(path, is a directory) of what lies below, sorted; nothing if nothing does."""
        from pyarrow.fs import FileType

        found = [
            (ObjectPath(self.scheme, i.path, self.options), i.type == FileType.Directory)
            for i in self._below(recursive)
            if i.type in (FileType.File, FileType.Directory)
        ]
        return sorted(found, key=lambda f: str(f[0]))

    def files_below(self, recursive: bool = True) -> list[tuple[ObjectPath, FileStatus]]:
        """Every object below this prefix (at any depth, unless not `recursive`), with its
        size and modification time, sorted: one listing, no request per object."""
        from pyarrow.fs import FileType

        found = [
            (ObjectPath(self.scheme, i.path, self.options), FileStatus(i.size, i.mtime_ns or 0))
            for i in self._below(recursive)
            if i.type == FileType.File
        ]
        return sorted(found, key=lambda f: str(f[0]))

    def _below(self, recursive: bool) -> list[Any]:
        from pyarrow.fs import FileSelector

        selector = FileSelector(self.key, allow_not_found=True, recursive=recursive)
        try:
            return list(self.fs.get_file_info(selector))
        except OSError as e:
            raise storage_error(str(self), e) from e

    def iterdir(self) -> Iterator[ObjectPath]:
        return iter([p for p, _ in self.listing()])

    def glob(self, pattern: str) -> Iterator[ObjectPath]:
        """Entries of this directory whose name matches `pattern` (no `/` in it)."""
        return iter([p for p in self.iterdir() if fnmatch.fnmatchcase(p.name, pattern)])

    def read_bytes(self) -> bytes:
        try:
            with self.fs.open_input_stream(self.key, compression=None) as f:
                return bytes(f.read())
        except FileNotFoundError:
            raise
        except OSError as e:
            if not self.exists():
                raise FileNotFoundError(str(self)) from e
            raise storage_error(str(self), e) from e

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.read_bytes().decode(encoding)

    def write_bytes(self, data: bytes) -> int:
        """One upload: the object appears whole, or not at all."""
        try:
            with self.fs.open_output_stream(self.key) as f:
                f.write(data)
        except OSError as e:
            raise storage_error(str(self), e) from e
        return len(data)

    def write_text(self, text: str, encoding: str = "utf-8") -> int:
        return self.write_bytes(text.encode(encoding))

    def unlink(self, missing_ok: bool = False) -> None:
        try:
            self.fs.delete_file(self.key)
        except FileNotFoundError:
            if not missing_ok:
                raise
        except OSError as e:
            if missing_ok and not self.exists():
                return
            raise storage_error(str(self), e) from e

    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        """Nothing to make: a prefix exists once an object is written below it. The bucket
        must exist; a missing one is said here, before anything is written."""
        from pyarrow.fs import FileType

        bucket = ObjectPath(self.scheme, self.bucket, self.options)
        try:
            missing = bucket._info().type == FileType.NotFound
        except StorageError:
            # Credentials that may write below a prefix but not look at the bucket: the
            # first write tells.
            return
        if missing:
            raise StorageError(f"{self}: the bucket {bucket} does not exist")

    def open_input(self) -> Any:
        """A random-access file: reads become ranged requests (Parquet reads a footer, then
        the column chunks it needs)."""
        try:
            return self.fs.open_input_file(self.key)
        except OSError as e:
            raise storage_error(str(self), e) from e

    def open_stream(self) -> Any:
        """A sequential read, for files read through from the start: the object's bytes as
        stored (pyarrow would decompress a `.gz` object by its name otherwise)."""
        try:
            return self.fs.open_input_stream(self.key, compression=None)
        except OSError as e:
            raise storage_error(str(self), e) from e

    def upload(self, local: Path) -> None:
        """Copy a complete local file here: the object appears whole when the copy ends."""
        import pyarrow.fs as pafs

        try:
            pafs.copy_files(str(local), self.key, destination_filesystem=self.fs)
        except OSError as e:
            raise storage_error(str(self), e) from e

    def create(self, data: bytes) -> bool:
        """Write this object only if it does not exist yet; False if it did."""
        return self.write_if(data, ABSENT) is not None

    def read_versioned(self) -> tuple[bytes, str | None] | None:
        """The object's bytes and its entity tag (S3; None elsewhere), read in one request;
        None if there is no such object."""
        if self.scheme != "s3":
            try:
                return self.read_bytes(), None
            except FileNotFoundError:
                return None
        client = s3_client(self.options)
        try:
            answer = client.get_object(Bucket=self.bucket, Key=self._object_key)
            return answer["Body"].read(), str(answer["ETag"])
        except client.exceptions.ClientError as e:
            if error_code(e) in ("404", "NoSuchKey", "NotFound"):
                return None
            raise storage_error(str(self), e) from e
        except Exception as e:  # botocore's connection errors share no base class with OSError
            raise storage_error(str(self), e) from e

    def delete_if(self, version: str | None) -> bool:
        """Delete this object if it still is at `version`; False if another writer changed
        it. Where the store has no conditional delete, it always deletes."""
        if self.scheme != "s3" or not version:
            self.unlink(missing_ok=True)
            return True
        client = s3_client(self.options)
        try:
            client.delete_object(Bucket=self.bucket, Key=self._object_key, IfMatch=version)
        except client.exceptions.ClientError as e:
            if error_code(e) in CONDITION_FAILED:
                return False
            raise storage_error(str(self), e) from e
        return True

    def write_if(self, data: bytes, version: str | None) -> str | None:
        """Write this object if it is still at `version` (an entity tag from
        `read_versioned` or from an earlier `write_if`; `ABSENT`: if there is no such
        object yet); its new entity tag, or None if the condition did not hold. On S3 this
        is a conditional write, atomic; on other stores a check followed by a write, and an
        entity tag of ''."""
        if self.scheme == "s3":
            condition = {"IfNoneMatch": "*"} if version == ABSENT else {"IfMatch": version or ""}
            return s3_put(self.options, str(self), self.bucket, self._object_key, data, **condition)
        if version == ABSENT and self.exists():
            return None
        self.write_bytes(data)
        return ""

    def abort_uploads(self, names: re.Pattern[str]) -> int:
        """Abort the unfinished multipart uploads of objects directly below this prefix
        whose name matches `names` (S3): what a process killed while uploading them leaves.
        Their number."""
        if self.scheme != "s3":
            return 0
        client = s3_client(self.options)
        prefix = f"{self._object_key}/" if self._object_key else ""
        aborted = 0
        try:
            pages = client.get_paginator("list_multipart_uploads").paginate(
                Bucket=self.bucket, Prefix=prefix
            )
            for page in pages:
                for upload in page.get("Uploads", []):
                    name = upload["Key"].removeprefix(prefix)
                    if "/" in name or not names.fullmatch(name):
                        continue
                    client.abort_multipart_upload(
                        Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                    )
                    aborted += 1
        except Exception as e:  # botocore's errors share no base class with OSError
            raise storage_error(str(self), e) from e
        return aborted

    @property
    def _object_key(self) -> str:
        return self.key.split("/", 1)[1] if "/" in self.key else ""


class PurePosix(str):
    """A relative name below an `ObjectPath`, with the `parts` of a path."""

    @property
    def parts(self) -> tuple[str, ...]:
        return tuple(p for p in self.split("/") if p)


def stop_on_store_failure(path: object, error: BaseException) -> None:
    """Raise `StorageError` if reading `path` failed because its store did not answer (a
    dropped connection, a refused or throttled request), not because the file is damaged:
    a damaged file's records are set aside, but a store's failure must stop the run, which
    a rerun resumes, rather than lose the rest of a file."""
    text = str(error)
    if isinstance(path, ObjectPath) and any(marker in text for marker in STORE_FAILURES):
        raise storage_error(str(path), error) from error

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
import fnmatch
import functools
import io
import os
import posixpath
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from bulkembed.errors import BulkembedError, UsageError

if TYPE_CHECKING:
    import pyarrow.fs as pafs

FILE_SCHEME = "file://"
# Object-store schemes, and the pyarrow filesystem that serves each.
SCHEMES = {"s3": "s3", "gs": "gcs", "gcs": "gcs", "az": "azure", "abfs": "azure"}
# What `--storage-option` takes.
OPTION_KEYS = ("account", "anonymous", "endpoint", "project", "region")
# `ObjectPath.write_if`'s condition for an object that must not exist yet.
ABSENT = "*"
# What S3 answers when a conditional write's condition does not hold.
# A condition on an object that is gone fails with "no such key".
_CONDITION_FAILED = (
    "PreconditionFailed",
    "ConditionalRequestConflict",
    "NoSuchKey",
    "404",
    "412",
    "409",
)
# How pyarrow and the stores word a failed request, as against a damaged file.
_STORE_FAILURES = (
    "AWS Error",
    "google::cloud::Status",
    "Azure Error",
    "curlCode",
    "Couldn't connect",
)
# What looks like a URI that `location` does not take (`hdfs://...`, `s3:/one-slash`): refused
# rather than made a local folder of that name. One letter before ':' is a drive (`C:/`).
_URI_LIKE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+:/")
# Bytes fetched per request by a buffered read of an object.
READ_BLOCK = 1 << 20
# Seconds to wait for a store's endpoint to answer before giving up on a connection.
CONNECT_TIMEOUT = 10


class StorageError(BulkembedError):
    """Object storage refused or could not be reached; the message names the URI."""


@dataclass(frozen=True, slots=True)
class StorageOptions:
    """`--storage-option KEY=VALUE` pairs: `endpoint` (a URL), `region`, `anonymous`
    (true/false), `project` (GCS), `account` (Azure)."""

    items: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, pairs: tuple[str, ...] | list[str]) -> StorageOptions:
        items = []
        for pair in pairs:
            key, sep, value = pair.partition("=")
            key = key.strip().lower()
            if not sep or key not in OPTION_KEYS:
                raise UsageError(
                    f"--storage-option {pair}: write KEY=VALUE with KEY one of "
                    f"{', '.join(OPTION_KEYS)}"
                )
            items.append((key, value.strip()))
        return cls(tuple(items))

    def get(self, key: str) -> str | None:
        return dict(self.items).get(key)

    @property
    def anonymous(self) -> bool:
        return (self.get("anonymous") or "").lower() in ("1", "true", "yes", "on")

    def endpoint(self, scheme: str) -> str | None:
        """The endpoint URL for a store of `scheme`: `endpoint=`, else for S3 the one the
        AWS tools take from the environment (boto3 reads it; pyarrow does not)."""
        given = self.get("endpoint")
        if given or scheme != "s3":
            return given
        return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")


def _split_endpoint(url: str) -> tuple[str, str]:
    """(scheme, host[:port]) of an endpoint URL; https when it names none."""
    scheme, _, host = url.rpartition("://")
    return scheme or "https", host


@functools.lru_cache(maxsize=16)
def filesystem(kind: str, options: StorageOptions) -> pafs.FileSystem:
    """The pyarrow filesystem of one store and set of options, made once per process."""
    import pyarrow.fs as pafs

    endpoint = options.endpoint("s3" if kind == "s3" else "")
    if kind in ("s3", "gcs"):
        arguments: dict[str, Any] = {"anonymous": options.anonymous}
        if endpoint:
            arguments["scheme"], arguments["endpoint_override"] = _split_endpoint(endpoint)
        if kind == "gcs":
            if options.get("project"):
                arguments["project_id"] = options.get("project")
            return pafs.GcsFileSystem(**arguments)
        if options.get("region"):
            arguments["region"] = options.get("region")
        return pafs.S3FileSystem(connect_timeout=CONNECT_TIMEOUT, **arguments)
    account = options.get("account") or os.environ.get("AZURE_STORAGE_ACCOUNT_NAME")
    if not account:
        raise UsageError(
            "az:// paths need the storage account: set AZURE_STORAGE_ACCOUNT_NAME or pass "
            "--storage-option account=NAME"
        )
    arguments = {"account_name": account}
    if endpoint:
        arguments["blob_storage_scheme"], arguments["blob_storage_authority"] = _split_endpoint(
            endpoint
        )
    return pafs.AzureFileSystem(**arguments)


@dataclass(frozen=True, slots=True)
class FileStatus:
    """What `stat` tells of a file."""

    st_size: int
    st_mtime_ns: int


def _short(error: BaseException) -> str:
    """The part of a store's error worth a line: pyarrow's AWS errors carry several."""
    text = " ".join(str(error).split())
    for marker in ("AWS Error ", "google::cloud::Status", "Azure Error "):
        if marker in text:
            text = text[text.index(marker) :]
    return text[:300]


def stop_on_store_failure(path: object, error: BaseException) -> None:
    """Raise `StorageError` if reading `path` failed because its store did not answer (a
    dropped connection, a refused or throttled request), not because the file is damaged:
    a damaged file's records are set aside, but a store's failure must stop the run, which
    a rerun resumes, rather than lose the rest of a file."""
    text = str(error)
    if isinstance(path, ObjectPath) and any(marker in text for marker in _STORE_FAILURES):
        raise storage_error(str(path), error) from error


def storage_error(uri: str, error: BaseException) -> StorageError:
    """One line for a failed request to a store: which URI, what the store said, and the
    settings a user would check."""
    reason = _short(error)
    hint = ""
    if uri.startswith("s3://"):
        hint = (
            "; check the credentials (AWS_ACCESS_KEY_ID, AWS_PROFILE), the bucket's name and "
            "region, and the endpoint (AWS_ENDPOINT_URL or --storage-option endpoint=URL)"
        )
    return StorageError(f"{uri}: {reason}{hint}")


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

    def files_below(self) -> list[tuple[ObjectPath, FileStatus]]:
        """Every object below this prefix, at any depth, with its size and modification
        time, sorted: one listing, no request per object."""
        from pyarrow.fs import FileType

        found = [
            (ObjectPath(self.scheme, i.path, self.options), FileStatus(i.size, i.mtime_ns or 0))
            for i in self._below(recursive=True)
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
        client = _s3_client(self.options)
        try:
            answer = client.get_object(Bucket=self.bucket, Key=self._object_key)
            return answer["Body"].read(), str(answer["ETag"])
        except client.exceptions.ClientError as e:
            if _code(e) in ("404", "NoSuchKey", "NotFound"):
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
        client = _s3_client(self.options)
        try:
            client.delete_object(Bucket=self.bucket, Key=self._object_key, IfMatch=version)
        except client.exceptions.ClientError as e:
            if _code(e) in _CONDITION_FAILED:
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
            return _s3_put(self, data, **condition)
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
        client = _s3_client(self.options)
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


def _s3_client(options: StorageOptions) -> Any:
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise BulkembedError(
            "writing to s3:// needs boto3 for conditional writes: pip install 'bulkembed[s3]'"
        ) from None
    return _cached_s3_client(boto3, Config, options)


@functools.lru_cache(maxsize=4)
def _cached_s3_client(boto3: Any, config: Any, options: StorageOptions) -> Any:
    arguments: dict[str, Any] = {
        "config": config(connect_timeout=CONNECT_TIMEOUT, retries={"max_attempts": 3})
    }
    if options.get("endpoint"):
        arguments["endpoint_url"] = options.get("endpoint")
    if options.get("region"):
        arguments["region_name"] = options.get("region")
    if options.anonymous:
        from botocore import UNSIGNED

        arguments["config"] = arguments["config"].merge(config(signature_version=UNSIGNED))
    return boto3.session.Session().client("s3", **arguments)


def _code(error: Any) -> str | None:
    """The error code of a botocore `ClientError`."""
    return error.response.get("Error", {}).get("Code")


def _s3_put(path: ObjectPath, data: bytes, **condition: str) -> str | None:
    """A conditional PUT; its entity tag, or None if the condition did not hold."""
    client = _s3_client(path.options)
    try:
        answer = client.put_object(Bucket=path.bucket, Key=path._object_key, Body=data, **condition)
    except client.exceptions.ClientError as e:
        if _code(e) in _CONDITION_FAILED:
            return None
        raise storage_error(str(path), e) from e
    except Exception as e:  # botocore's connection errors share no base class with OSError
        raise storage_error(str(path), e) from e
    return str(answer["ETag"])


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
    footer, then only the column chunks asked for, in ranged requests."""
    import pyarrow.parquet as pq

    if isinstance(path, ObjectPath):
        return pq.ParquetFile(path.open_input())
    return pq.ParquetFile(path)


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
    whole (`commit`), or dropped (`discard`)."""

    local: Path
    target: ObjectPath

    @classmethod
    def for_target(cls, target: ObjectPath) -> Spool:
        prefix = f"bulkembed-spool-{os.getpid()}-"
        handle, name = tempfile.mkstemp(prefix=prefix, suffix=f"-{target.name}")
        os.close(handle)
        return cls(Path(name), target)

    def commit(self) -> None:
        try:
            self.target.upload(self.local)
        finally:
            self.local.unlink(missing_ok=True)

    def discard(self) -> None:
        self.local.unlink(missing_ok=True)

    @staticmethod
    def remove_left_by(pid: int) -> None:
        """Delete the spool files of process `pid` (one that died while writing)."""
        for path in Path(tempfile.gettempdir()).glob(f"bulkembed-spool-{pid}-*"):
            path.unlink(missing_ok=True)

    @staticmethod
    def remove_orphans() -> None:
        """Delete the spool files of processes of this machine that are gone (a run killed
        while it wrote parts)."""
        for path in Path(tempfile.gettempdir()).glob("bulkembed-spool-*-*"):
            pid = path.name.split("-")[2]
            if pid.isdigit() and not process_alive(int(pid)):
                path.unlink(missing_ok=True)

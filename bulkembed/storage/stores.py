"""The stores behind object paths: `--storage-option`s, the pyarrow filesystem of each
store, and the errors a store answers with."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bulkembed.errors import BulkembedError, UsageError

if TYPE_CHECKING:
    import pyarrow.fs as pafs

# Object-store schemes, and the pyarrow filesystem that serves each.
SCHEMES = {"s3": "s3", "gs": "gcs", "gcs": "gcs", "az": "azure", "abfs": "azure"}
# What `--storage-option` takes.
OPTION_KEYS = ("account", "anonymous", "endpoint", "project", "region")
# How pyarrow and the stores word a failed request, as against a damaged file.
STORE_FAILURES = (
    "AWS Error",
    "google::cloud::Status",
    "Azure Error",
    "curlCode",
    "Couldn't connect",
)
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

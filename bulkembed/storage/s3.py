"""Conditional writes to S3 (`If-None-Match`, `If-Match`), through boto3: what pyarrow's
filesystem does not offer."""

from __future__ import annotations

import functools
from typing import Any

from bulkembed.errors import BulkembedError
from bulkembed.storage.stores import CONNECT_TIMEOUT, StorageOptions, storage_error

# What S3 answers when a conditional write's condition does not hold.
# A condition on an object that is gone fails with "no such key".
CONDITION_FAILED = (
    "PreconditionFailed",
    "ConditionalRequestConflict",
    "NoSuchKey",
    "404",
    "412",
    "409",
)


def s3_client(options: StorageOptions) -> Any:
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


def error_code(error: Any) -> str | None:
    """The error code of a botocore `ClientError`."""
    return error.response.get("Error", {}).get("Code")


def s3_put(
    options: StorageOptions, uri: str, bucket: str, key: str, data: bytes, **condition: str
) -> str | None:
    """A conditional PUT of `key` in `bucket` (`uri`, for messages); its entity tag, or None
    if the condition did not hold."""
    client = s3_client(options)
    try:
        answer = client.put_object(Bucket=bucket, Key=key, Body=data, **condition)
    except client.exceptions.ClientError as e:
        if error_code(e) in CONDITION_FAILED:
            return None
        raise storage_error(uri, e) from e
    except Exception as e:  # botocore's connection errors share no base class with OSError
        raise storage_error(uri, e) from e
    return str(answer["ETag"])

"""A real S3 server on 127.0.0.1 for the tests: moto in server mode, in its own process.

The server checks credentials (moto's IAM emulation, switched on after the three requests
that make the test user), so wrong keys are refused as a real store refuses them. Tests
reach it as users do: through `AWS_ENDPOINT_URL` and the standard credential variables.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Requests the server answers without credentials: the user, its policy, its key.
_SETUP_REQUESTS = 3
_START_SECONDS = 30


@dataclass(frozen=True)
class S3Server:
    """A running server: where it listens and the keys that it accepts."""

    endpoint: str
    access_key: str
    secret_key: str
    process: subprocess.Popen
    log: Path

    def requests(self, after: int = 0) -> list[str]:
        """The requests the server answered, `METHOD /bucket/key?query` each, from byte
        `after` of its log on (`log.stat().st_size` taken before them)."""
        time.sleep(0.2)  # the last line may still be on its way to the log
        with open(self.log, "rb") as f:
            f.seek(after)
            lines = f.read().decode("utf-8", "replace").splitlines()
        found = (re.search(r'"(?:\x1b\[[0-9;]*m)*([A-Z]+ \S+) HTTP/', line) for line in lines)
        return [m.group(1) for m in found if m]

    @property
    def environment(self) -> dict[str, str]:
        """What a process needs to reach the server, as a user would set it."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name="us-east-1",
        )

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        """Every object key in `bucket` under `prefix`, sorted."""
        pages = (
            self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        )
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_s3_server(log: Path) -> S3Server:
    """Start moto's server on a free loopback port and make a user with full access."""
    import boto3

    port = _free_port()
    environment = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(_SETUP_REQUESTS)}
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=environment,
        )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + _START_SECONDS
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"the S3 server did not start; see {log}") from None
            time.sleep(0.1)
    iam = boto3.client(
        "iam",
        endpoint_url=endpoint,
        aws_access_key_id="setup",
        aws_secret_access_key="setup",
        region_name="us-east-1",
    )
    iam.create_user(UserName="bulkembed")
    iam.put_user_policy(
        UserName="bulkembed",
        PolicyName="all",
        PolicyDocument='{"Version": "2012-10-17", "Statement": '
        '[{"Effect": "Allow", "Action": "*", "Resource": "*"}]}',
    )
    key = iam.create_access_key(UserName="bulkembed")["AccessKey"]
    return S3Server(endpoint, key["AccessKeyId"], key["SecretAccessKey"], process, log)

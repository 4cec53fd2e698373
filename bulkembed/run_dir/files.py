"""The files of a run directory: their names, and JSON written whole or not at all."""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from typing import Any

from bulkembed.errors import OutputError
from bulkembed.storage import AnyPath, ObjectPath

# Reads of a run-directory JSON object before it counts as damaged (see `read_json`).
_OBJECT_READS = 3

CONFIG_FILE = "config.json"
# What a run mode keeps across restarts (an incremental run's deletes decision).
MODE_FILE = "mode.json"
# What bulkembed writes in a run directory besides the configuration and the ledger: all
# that `--overwrite` removes there. Anything else is left alone.
OWN_FILES = (
    "summary.json",
    MODE_FILE,
    "complete",
    "vocab.json",
    "quantization.json",
    "int8.json",
    "shards.json",
    "bad_records.jsonl",
    "failed.json",
    "ledger.json",
    "report.html",
)
# Temporary files: `.NAME.PID-TOKEN.tmp` (`write_json_atomically`) and the quarantine's.
TEMPORARY = re.compile(r"\..+\.\d+-[0-9a-f]{8}\.tmp|\.bad_records(\.shard-\d+-of-\d+)?\.jsonl\.tmp")
# Vectors an interrupted run saved for the next (`bulkembed.engine.saved`).
SAVED_FILE = re.compile(r"saved-[0-9a-f]{16}\.parquet")
OWN_NAMES = re.compile(
    r"bad_records\.shard-\d+-of-\d+\.jsonl|lock\.shard-\d+-of-\d+|"
    + SAVED_FILE.pattern
    + "|"
    + TEMPORARY.pattern
)
MARKER = re.compile(r"part-\d{5,}-\d{6,}\.json")


def write_json_atomically(path: AnyPath, data: Any, exclusive: bool = False) -> bool:
    """Write `path` whole or not at all, through a temporary file of this writer's own (runs
    with `--shard` write the same files side by side). With `exclusive`, only if `path`
    does not exist yet: False if it did. An object is written in one upload, which is
    whole or nothing by itself (an exclusive one with a conditional write)."""
    if isinstance(path, ObjectPath):
        text = json_text(data)
        if exclusive:
            return path.create(text.encode("utf-8"))
        path.write_text(text)
        return True
    temporary = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        with open(temporary, "w", encoding="utf-8") as f:
            f.write(json_text(data))
            f.flush()
            os.fsync(f.fileno())
        if not exclusive:
            os.replace(temporary, path)
            return True
        try:
            os.link(temporary, path)
            return True
        except FileExistsError:
            return False
        finally:
            temporary.unlink()
    except OSError as e:
        temporary.unlink(missing_ok=True)
        raise OutputError(f"cannot write {path}: {e}") from e


def json_text(data: Any) -> str:
    """The text of a run-directory JSON file."""
    return json.dumps(data, indent=2, default=str) + "\n"


def read_json(path: AnyPath) -> Any:
    """A run-directory file's JSON; one that cannot be read is a damaged output.

    An object that another writer (a `--shard` beside this one) replaces while it is read
    can come back cut: the object store gives the size of one version and the bytes of the
    next. Such a read is made again, up to `_OBJECT_READS` times, before the file counts as
    damaged."""
    reads = _OBJECT_READS if isinstance(path, ObjectPath) else 1
    attempt = 1
    while True:
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            if attempt < reads:
                time.sleep(0.2 * attempt)
                attempt += 1
                continue
            raise OutputError(
                f"cannot read {path}: {e}; the output is damaged, use --overwrite"
            ) from e
        except OSError as e:
            raise OutputError(
                f"cannot read {path}: {e}; the output is damaged, use --overwrite"
            ) from e

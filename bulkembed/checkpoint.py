"""The run directory `OUT/_bulkembed/`: configuration, summary and quarantined records."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bulkembed.errors import OutputError
from bulkembed.sources import BadRecord

RUN_DIRECTORY = "_bulkembed"


def _write_json_atomically(path: Path, data: dict[str, Any]) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(temporary, path)


class RunDirectory:
    """An output directory: Parquet parts at the top, bookkeeping in `_bulkembed/`."""

    def __init__(self, output: Path) -> None:
        self.output = output
        self.meta = output / RUN_DIRECTORY
        self.config_path = self.meta / "config.json"
        self.summary_path = self.meta / "summary.json"
        self.bad_records_path = self.meta / "bad_records.jsonl"

    def holds_output(self) -> bool:
        """Whether an earlier run left parts or bookkeeping here."""
        if not self.output.is_dir():
            return False
        return self.meta.exists() or any(self.output.glob("*.parquet"))

    def prepare(self, overwrite: bool) -> None:
        """Create the directory, or empty an earlier run's output when `overwrite` is set."""
        if self.output.exists() and not self.output.is_dir():
            raise OutputError(f"--output {self.output} is a file; pass a directory")
        if self.holds_output():
            if not overwrite:
                raise OutputError(
                    f"{self.output} already holds bulkembed output: "
                    "pass --overwrite to replace it, or choose another --output"
                )
            self._remove_previous()
        try:
            self.meta.mkdir(parents=True, exist_ok=True)
            probe = self.meta / ".write-probe"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            raise OutputError(
                f"cannot write to {self.output}: {e.strerror or e}; choose another --output"
            ) from e

    def _remove_previous(self) -> None:
        for pattern in ("*.parquet", ".*.parquet.tmp"):
            for path in self.output.glob(pattern):
                path.unlink()
        shutil.rmtree(self.meta, ignore_errors=True)

    def write_config(self, config: dict[str, Any]) -> None:
        _write_json_atomically(self.config_path, config)

    def write_summary(self, summary: dict[str, Any]) -> None:
        _write_json_atomically(self.summary_path, summary)

    def quarantine(self, record: BadRecord) -> None:
        """Append a record that cannot be embedded to `bad_records.jsonl`."""
        fields = {k: v for k, v in asdict(record).items() if v is not None}
        with open(self.bad_records_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(fields, default=str) + "\n")

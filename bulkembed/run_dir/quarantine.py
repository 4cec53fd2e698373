"""The quarantine: `bad_records.jsonl`, one line per record set aside, with its unit.

Lines are appended as units commit, and the file is rebuilt from the done-markers (which
keep their unit's bad records) at every start and at the end of a run, so a replayed unit
does not report its bad records twice and a lost or damaged file comes back whole. An
object cannot be appended to: on object storage the file is only written whole, at the
start and at the end of a run.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from bulkembed.contracts import UnitRecord
from bulkembed.errors import OutputError
from bulkembed.storage import AnyPath, ObjectPath, Spool


def _line(fields: dict[str, Any], part: str) -> str:
    return json.dumps({**fields, "part": part}, default=str) + "\n"


class Quarantine:
    """The bad records file at `path`."""

    def __init__(self, path: AnyPath) -> None:
        self.path = path

    def append(self, bad: list[dict[str, Any]], part: str) -> None:
        """Append the bad records of unit `part`, in one write (processes that share the
        file append whole lines)."""
        if not bad or isinstance(self.path, ObjectPath):
            return
        try:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write("".join(_line(fields, part) for fields in bad))
        except OSError as e:
            raise OutputError(f"cannot write {self.path}: {e}") from e

    @staticmethod
    def _write_lines(
        local: Path, units: list[str], marker: Callable[[str], dict[str, Any] | None]
    ) -> None:
        with open(local, "w", encoding="utf-8") as f:
            for part in units:
                fields = marker(part) or {}
                f.write("".join(_line(b, part) for b in fields.get("bad", [])))

    def rebuild(
        self,
        done: dict[str, UnitRecord],
        mine: Collection[str] | None,
        marker: Callable[[str], dict[str, Any] | None],
    ) -> None:
        """Write the file anew from the markers of the done units (of `mine` only, when
        given), in unit order, one marker in memory at a time."""
        units = sorted(p for p, r in done.items() if r.bad_records and (mine is None or p in mine))
        if not units:
            self.path.unlink(missing_ok=True)
            return
        if isinstance(self.path, ObjectPath):
            spool = Spool.for_target(self.path)
            try:
                self._write_lines(spool.local, units, marker)
                spool.commit()
            finally:
                spool.discard()
            return
        temporary = self.path.with_name(f".{self.path.name}.tmp")
        try:
            self._write_lines(temporary, units, marker)
            os.replace(temporary, self.path)
        except OSError as e:
            with contextlib.suppress(OSError):
                temporary.unlink()
            raise OutputError(f"cannot write {self.path}: {e}") from e

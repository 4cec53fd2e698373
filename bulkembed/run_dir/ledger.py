"""The ledger: one done-marker `done/<part>.json` per committed unit, and `complete`.

A marker is written atomically, after its unit's part is committed, and holds the unit's
counts and bad records. `complete` names how many units the inputs have, so a unit that lost
both its marker and its part is found too.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import asdict
from typing import Any

from bulkembed.contracts import UnitRecord
from bulkembed.run_dir.files import MARKER, write_json_atomically
from bulkembed.storage import AnyPath


class Ledger:
    """The markers in `meta/done/` and the `meta/complete` flag."""

    def __init__(self, meta: AnyPath) -> None:
        self.done_dir = meta / "done"
        self.complete_path = meta / "complete"

    def path(self, part: str) -> AnyPath:
        return self.done_dir / f"{part}.json"

    def marked(self) -> list[str]:
        """The parts that have a marker file, readable or not."""
        if not self.done_dir.is_dir():
            return []
        names = [p.name for p in self.done_dir.iterdir()]
        return sorted(name.removesuffix(".json") for name in names if MARKER.fullmatch(name))

    def read(self, part: str) -> dict[str, Any] | None:
        """A marker's content; None for one that is damaged (cut short, edited)."""
        try:
            fields = json.loads(self.path(part).read_text(encoding="utf-8"))
            UnitRecord(**{k: v for k, v in fields.items() if k != "bad"})
        except (OSError, ValueError, TypeError):
            return None
        return fields

    def units(self) -> tuple[dict[str, UnitRecord], list[str]]:
        """The committed units by part name, and the parts whose marker is damaged."""
        done, damaged = {}, []
        for part in self.marked():
            fields = self.read(part)
            if fields is None:
                damaged.append(part)
            else:
                fields.pop("bad", None)
                done[part] = UnitRecord(**fields)
        return done, damaged

    def mark_done(self, record: UnitRecord, bad: list[dict[str, Any]]) -> None:
        """Record a unit, with its bad records, as committed."""
        write_json_atomically(self.path(record.part), {**asdict(record), "bad": bad})

    def forget(self, part: str) -> None:
        self.path(part).unlink(missing_ok=True)

    def mark_complete(self, units: int) -> None:
        """Every unit of the inputs is done: there are `units` of them."""
        write_json_atomically(self.complete_path, {"units": units})

    def is_complete(self, done: Collection[str] | None = None) -> bool:
        """Whether every unit is done; with `done`, whether they all still are (as many as
        when the run was marked complete)."""
        if not self.complete_path.exists():
            return False
        if done is None:
            return True
        try:
            return len(done) >= json.loads(self.complete_path.read_text(encoding="utf-8"))["units"]
        except (OSError, ValueError, KeyError, TypeError):
            return False

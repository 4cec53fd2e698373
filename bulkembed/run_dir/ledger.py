"""The ledger: one done-marker `done/<part>.json` per committed unit, and `complete`.

A marker is written atomically, after its unit's part is committed, and holds the unit's
counts and bad records. `complete` names how many units the inputs have, so a unit that lost
both its marker and its part is found too.

On object storage, where reading a marker is a request of its own, the ledger also keeps a
snapshot, `ledger.json`: every marker the writing process knew of, with its size, in one
object, written every `SNAPSHOT_EVERY` markers (but by `--shard` runs) and when the run is
marked complete. The
markers listed (one listing) are the ledger; a listed marker whose size is the one in the
snapshot is taken from it, any other is read. A snapshot that does not read whole (its
digest differs) is ignored, and forgetting a marker removes it: a restart reads the
snapshot and the markers written since.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection
from dataclasses import asdict
from typing import Any

from bulkembed.contracts import UnitRecord
from bulkembed.run_dir.files import MARKER, json_text, write_json_atomically
from bulkembed.storage import AnyPath, ObjectPath

# The snapshot's name in the run directory, and how many markers a process writes between
# two snapshots.
SNAPSHOT = "ledger.json"
SNAPSHOT_EVERY = 1000


class Ledger:
    """The markers in `meta/done/` and the `meta/complete` flag."""

    def __init__(self, meta: AnyPath, periodic: bool = True) -> None:
        self.done_dir = meta / "done"
        self.complete_path = meta / "complete"
        self.snapshot_path = meta / SNAPSHOT
        # On object storage: the markers this process read or wrote, by part: (size, fields).
        self._known: dict[str, tuple[int, dict[str, Any]]] = {}
        self._since_snapshot = 0
        # Whether snapshots are written as markers are (else only when marked complete).
        self.periodic = periodic

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
        known = self._known.get(part)
        if known is not None:
            return dict(known[1])
        return self._read_marker(part)

    def _read_marker(self, part: str) -> dict[str, Any] | None:
        try:
            fields = json.loads(self.path(part).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return fields if _whole(fields) else None

    def units(self) -> tuple[dict[str, UnitRecord], list[str]]:
        """The committed units by part name, and the parts whose marker is damaged."""
        done, damaged = {}, []
        for part, fields in self._markers():
            if fields is None:
                damaged.append(part)
            else:
                fields = {k: v for k, v in fields.items() if k != "bad"}
                done[part] = UnitRecord(**fields)
        return done, damaged

    def _markers(self) -> list[tuple[str, dict[str, Any] | None]]:
        """Each marked part and its marker's content (None: damaged): on object storage
        from the snapshot where a listed marker has the size the snapshot gives it."""
        if not isinstance(self.done_dir, ObjectPath):
            return [(part, self.read(part)) for part in self.marked()]
        listed = {
            path.name.removesuffix(".json"): status.st_size
            for path, status in self.done_dir.files_below(recursive=False)
            if MARKER.fullmatch(path.name)
        }
        known = {**self._read_snapshot(), **self._known}
        self._known = {}
        found: list[tuple[str, dict[str, Any] | None]] = []
        for part in sorted(listed):
            entry = known.get(part)
            if entry is not None and entry[0] == listed[part] and _whole(entry[1]):
                fields: dict[str, Any] | None = entry[1]
            else:
                fields = self._read_marker(part)
            if fields is not None:
                self._known[part] = (listed[part], fields)
            found.append((part, None if fields is None else dict(fields)))
        return found

    def _read_snapshot(self) -> dict[str, tuple[int, dict[str, Any]]]:
        """The snapshot's markers by part: (size, fields); none if it is missing or does
        not read whole."""
        try:
            snapshot = json.loads(self.snapshot_path.read_text(encoding="utf-8"))
            markers = snapshot["markers"]
            if snapshot["digest"] != _digest(markers):
                return {}
            return {part: (int(size), fields) for part, (size, fields) in markers.items()}
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return {}

    def write_snapshot(self) -> None:
        """Write the snapshot of the markers this process knows of (object storage only)."""
        if not isinstance(self.done_dir, ObjectPath):
            return
        markers = {part: [size, fields] for part, (size, fields) in sorted(self._known.items())}
        write_json_atomically(self.snapshot_path, {"markers": markers, "digest": _digest(markers)})
        self._since_snapshot = 0

    def mark_done(self, record: UnitRecord, bad: list[dict[str, Any]]) -> None:
        """Record a unit, with its bad records, as committed."""
        fields = {**asdict(record), "bad": bad}
        write_json_atomically(self.path(record.part), fields)
        if isinstance(self.done_dir, ObjectPath):
            # What was written: the same text the marker holds, read back as JSON.
            text = json_text(fields)
            self._known[record.part] = (len(text.encode("utf-8")), json.loads(text))
            self._since_snapshot += 1
            if self.periodic and self._since_snapshot >= SNAPSHOT_EVERY:
                self.write_snapshot()

    def forget(self, part: str) -> None:
        """Remove a unit's marker (and the snapshot, which may name it)."""
        self._known.pop(part, None)
        self.snapshot_path.unlink(missing_ok=True)
        self.path(part).unlink(missing_ok=True)

    def mark_complete(self, units: int) -> None:
        """Every unit of the inputs is done: there are `units` of them."""
        self.write_snapshot()
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


def _digest(markers: dict[str, Any]) -> str:
    """A digest of a snapshot's markers, to know it reads whole."""
    return hashlib.sha256(json.dumps(markers, sort_keys=True).encode("utf-8")).hexdigest()


def _whole(fields: Any) -> bool:
    """Whether a marker's content holds a unit's record."""
    try:
        UnitRecord(**{k: v for k, v in fields.items() if k != "bad"})
    except (TypeError, ValueError, AttributeError):
        return False
    return True

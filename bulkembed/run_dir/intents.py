"""Intents: what a unit's writer is about to commit into a LanceDB table, written to the run
directory before the commit (`intents/<part>.json`: the unit's data files and its label).

A restart reads them to tell a unit that was committed but not marked done from one that
was never committed (`bulkembed.sinks.lance` has the protocol). They are kept after the
unit is marked done: a lost done-marker is taken back from its intent.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Collection, Iterator
from typing import Any

from bulkembed.run_dir.files import MARKER, TEMPORARY, write_json_atomically
from bulkembed.run_dir.lease import directory_lock
from bulkembed.storage import AnyPath


class Intents:
    """The intents in `meta/intents/`, one per unit that has been committed or is about to be."""

    def __init__(self, meta: AnyPath) -> None:
        self.directory = meta / "intents"

    def path(self, part: str) -> AnyPath:
        return self.directory / f"{part}.json"

    def write(self, part: str, intent: dict[str, Any]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        write_json_atomically(self.path(part), intent)

    def read(self, part: str) -> dict[str, Any] | None:
        """A unit's intent; None when there is none, or it is damaged."""
        try:
            intent = json.loads(self.path(part).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return intent if isinstance(intent, dict) else None

    def all(self) -> dict[str, dict[str, Any]]:
        """Every readable intent, by part name."""
        if not self.directory.is_dir():
            return {}
        found = {}
        names = sorted(path.name for path in self.directory.iterdir())
        for name in names:
            part = name.removesuffix(".json")
            if MARKER.fullmatch(name) and (intent := self.read(part)) is not None:
                found[part] = intent
        return found

    def forget(self, part: str) -> None:
        self.path(part).unlink(missing_ok=True)

    def remove_temporaries(self, mine: Collection[str] | None) -> None:
        """Delete what an intent write cut short left (of the units in `mine`, when given)."""
        if not self.directory.is_dir():
            return
        for path in self.directory.iterdir():
            part = path.name[1:].split(".")[0]
            if TEMPORARY.fullmatch(path.name) and (mine is None or part in mine):
                path.unlink(missing_ok=True)

    def remove(self) -> None:
        """Delete every intent (`--overwrite`), and nothing else."""
        if not self.directory.is_dir():
            return
        for path in self.directory.iterdir():
            if MARKER.fullmatch(path.name) or TEMPORARY.fullmatch(path.name):
                path.unlink()


@contextlib.contextmanager
def finishing(meta: AnyPath, label: str) -> Iterator[None]:
    """Hold the right to finish the output (`Sink.finish`, then `complete`): `--shard` runs
    that find every unit done at the same time take turns. Raises `LockedError` when
    another run holds it."""
    lock = directory_lock(meta / "finishing", label, None)
    lock.lock_path.parent.mkdir(exist_ok=True)
    lock.acquire()
    try:
        yield
    finally:
        lock.release()

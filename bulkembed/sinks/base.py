"""The sink interface: rows are written into a named part, then the part is committed.

A part holds the rows of one unit of work. The run directory's ledger marks a unit done only
after `commit` returns, so a sink must make a committed part durable and keep an uncommitted
one invisible, or be able to take it back in `reconcile`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:
    from bulkembed.contracts import UnitRecord


def unshown(phase: str) -> None:
    """A step of `Sink.finish` that nobody is told about."""


def unfenced() -> None:
    """The fence of a run that no other run can take the output from (see `Sink.start`)."""


@dataclass(slots=True)
class Recovered:
    """What `Sink.reconcile` found beyond what the ledger says: `adopted`, the content of
    done-markers that were lost but whose parts are complete and this run's (taken from the
    parts); `lost`, done units whose rows are gone (to embed again)."""

    adopted: list[dict[str, Any]] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)


class Sink(ABC):
    """Writes record batches into parts; a part is invisible until `commit`.

    `resumable` sinks keep what earlier runs committed: `reconcile` brings them back to
    exactly the committed units, and `committed_ids` lists those units' ids."""

    resumable = True

    @property
    @abstractmethod
    def description(self) -> str:
        """Where the rows go, for messages."""

    def check_foreign(self, overwrite: bool) -> None:  # noqa: B027 (a stream has nothing)
        """Fail if the target holds what bulkembed did not write and would have to overwrite
        or share the place with (checked only when no run of ours is there); with
        `overwrite`, only what it would overwrite."""

    def remove(self, marked: Collection[str]) -> None:  # noqa: B027 (as for check_foreign)
        """Delete every row bulkembed wrote here, and nothing else (`--overwrite`);
        `marked` names the parts that the ledger says are done."""

    def discard(self, parts: Collection[str]) -> None:  # noqa: B027 (as for check_foreign)
        """Delete the committed parts `parts`, which the ledger no longer names."""

    def reconcile(
        self, done: dict[str, UnitRecord], run: str, mine: Collection[str] | None = None
    ) -> Recovered:
        """Drop rows of units not in `done` (of those in `mine` only, when given: other
        runs write the rest), except complete parts of run `run` whose marker was lost: those
        are `adopted`. Done units whose rows are gone are `lost`. What cannot be told apart
        from data bulkembed did not write is refused, never deleted."""
        return Recovered()

    def lost_units(self, done: dict[str, UnitRecord]) -> list[str]:
        """The done units whose rows are plainly gone (a cheap check, for `status`)."""
        return []

    def committed_ids(self, done: dict[str, UnitRecord]) -> Iterator[Any]:
        """The ids of the rows of the units in `done`."""
        return iter(())

    @abstractmethod
    def start(self, schema: pa.Schema, fence: Callable[[], None] = unfenced) -> None:
        """Get ready to write rows of `schema`. `fence` raises when this run may no longer
        write the output (another run took its lease): a sink calls it right before a commit
        makes rows visible, after the rows are written."""

    @abstractmethod
    def write(self, part: str, batch: pa.RecordBatch) -> None:
        """Append rows to `part`, opening it on first use."""

    @abstractmethod
    def commit(self, part: str, label: dict[str, Any]) -> dict[str, Any]:
        """Make `part` complete and visible at once; return what its done-marker must keep
        to find it again. A part with no rows leaves nothing behind. `label` (the run's id
        and the unit's marker) goes into the part where the sink can keep it, so that a lost
        marker can be taken back from the part."""

    def finish(self, phase: Callable[[str], None] = unshown) -> None:  # noqa: B027
        """Every unit is committed: finalize the target (indexes, compaction, end of stream),
        naming each step that takes a while to `phase` (most sinks have nothing left to do)."""

    @abstractmethod
    def close(self) -> None:
        """Drop parts that were not committed."""

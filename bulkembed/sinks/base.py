"""The sink interface: rows are written into a named part, then the part is committed.

A part holds the rows of one unit of work. The run directory's ledger marks a unit done only
after `commit` returns, so a sink must make a committed part durable and keep an uncommitted
one invisible, or be able to take it back in `reconcile`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:
    from bulkembed.checkpoint import UnitRecord


class Sink(ABC):
    """Writes record batches into parts; a part is invisible until `commit`.

    `resumable` sinks keep what earlier runs committed: `reconcile` brings them back to
    exactly the committed units, and `committed_ids` lists those units' ids."""

    resumable = True

    @property
    @abstractmethod
    def description(self) -> str:
        """Where the rows go, for messages."""

    def foreign_data(self) -> str | None:
        """What bulkembed did not write but would overwrite, if anything (checked only when
        no run of ours is there)."""
        return None

    def remove(self) -> None:  # noqa: B027 (a sink that keeps nothing has nothing to do)
        """Delete every row bulkembed wrote here (`--overwrite`)."""

    def reconcile(  # noqa: B027 (as for remove)
        self, done: dict[str, UnitRecord], parts: Collection[str] | None = None
    ) -> None:
        """Drop rows of units not in `done` (of those in `parts` only, when given: other
        runs write the rest); fail if rows of a done unit are missing."""

    def committed_ids(self, done: dict[str, UnitRecord]) -> Iterator[Any]:
        """The ids of the rows of the units in `done`."""
        return iter(())

    @abstractmethod
    def start(self, schema: pa.Schema) -> None:
        """Get ready to write rows of `schema`."""

    @abstractmethod
    def write(self, part: str, batch: pa.RecordBatch) -> None:
        """Append rows to `part`, opening it on first use."""

    @abstractmethod
    def commit(self, part: str) -> dict[str, Any]:
        """Make `part` complete and visible at once; return what its done-marker must keep
        to find it again. A part with no rows leaves nothing behind."""

    def finish(self) -> None:  # noqa: B027 (most sinks have nothing left to do)
        """Every unit is committed: finalize the target (indexes, compaction, end of stream)."""

    @abstractmethod
    def close(self) -> None:
        """Drop parts that were not committed."""

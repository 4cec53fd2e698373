"""The sink interface: rows are written into a named part, then the part is committed.

A part holds the rows of one unit of work. The run directory's ledger marks a unit done only
after `commit` returns, so a sink must make a committed part durable and keep an uncommitted
one invisible, or be able to take it back in `reconcile`.
"""

from __future__ import annotations

import copy
import functools
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

if TYPE_CHECKING:
    from bulkembed.contracts import UnitRecord
    from bulkembed.storage import AnyPath


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


class IntentLog(Protocol):
    """Where writers keep what they are about to commit, for a sink that commits in two
    steps: the run directory's (`bulkembed.run_dir.intents`)."""

    def write(self, part: str, intent: dict[str, Any]) -> None: ...

    def read(self, part: str) -> dict[str, Any] | None: ...

    def all(self) -> dict[str, dict[str, Any]]: ...

    def forget(self, part: str) -> None: ...

    def remove_temporaries(self, mine: Collection[str] | None) -> None: ...

    def remove(self) -> None: ...


class Sink(ABC):
    """Writes record batches into parts; a part is invisible until `commit`.

    A sink of a resumable kind (`Capabilities.resumable`) keeps what earlier runs
    committed: `reconcile` brings it back to exactly the committed units, and
    `committed_ids` lists those units' ids."""

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

    def committed_ids(self, done: dict[str, UnitRecord]) -> Iterator[pa.Array]:
        """The ids of the rows of the units in `done`, an array at a time."""
        return iter(())

    def part_schema(self, part: str) -> pa.Schema | None:
        """The schema of committed part `part`, where the sink keeps one per part."""
        return None

    def process_copies(self) -> Callable[[], Sink]:
        """What makes, in another process that commits parts into the same output (a device
        process, a Ray actor), that process's own sink; made here, before that process
        starts, and sent to it (a copy of this sink, by default)."""
        return functools.partial(copy.copy, self)

    def abandon(self, writers: Collection[int]) -> None:  # noqa: B027 (as for check_foreign)
        """Delete what the processes `writers` (process ids) left half-written: device
        processes that died or were stopped."""

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

    def adopt(self, part: str, source: AnyPath, rows: int, label: dict[str, Any]) -> bool:
        """Commit as `part`, labelled `label`, the `rows` rows of `source`: a part of a
        previous output that holds, in order, what this part would. False where the sink
        cannot take the file as it is (its rows are then written and committed)."""
        return False

    def finish(self, phase: Callable[[str], None] = unshown) -> None:  # noqa: B027
        """Every unit is committed: finalize the target (indexes, compaction, end of stream),
        naming each step that takes a while to `phase` (most sinks have nothing left to do)."""

    @abstractmethod
    def close(self) -> None:
        """Drop parts that were not committed."""


class OutputRows(Protocol):
    """An output's rows at one version, in the output contract's column names (`id`,
    `dense`, `content_hash`, ...), whatever the store calls them; rows are found by their
    offset."""

    @property
    def names(self) -> list[str]:
        """The columns it has."""
        ...

    def id_field(self) -> pa.Field:
        """The `id` column's field."""
        ...

    def read(self, columns: list[str]) -> pa.Table:
        """Every row's `columns`, in offset order."""
        ...

    def take(self, offsets: list[int], columns: list[str]) -> pa.Table:
        """The `columns` of the rows at `offsets`, in that order."""
        ...


class ChangeSet(ABC):
    """What a `--since` run writes beside an output whose kind keeps a change set: each
    unit's new and changed rows (its upserts), and the ids gone, once every unit is done."""

    @abstractmethod
    def upserts(self) -> Sink:
        """A sink for the upserts: one per writing process. A bound method of a change set
        is pickled into device processes and Ray actors, which make their own."""

    @abstractmethod
    def open(self, mine: Collection[str] | None) -> None:
        """Make it ready, and drop what a crash left half-written (of the units in `mine`,
        when given)."""

    @abstractmethod
    def remove(self) -> None:
        """Delete it (`--overwrite`): bulkembed's own files, and nothing else."""

    @abstractmethod
    def write_deletes(self, ids: pa.ChunkedArray) -> None:
        """Write the ids of the previous output that are gone, whole or not at all."""


class InPlaceSync(ABC):
    """What an output that `--since` may sync in place offers (`Capabilities.in_place`):
    its versions, the rows at one of them, a sink that merges units' rows by id, deletes
    by id, and the sink of id-only parts that the sync's ledger keeps."""

    @abstractmethod
    def version(self) -> int:
        """The output's latest version."""

    @abstractmethod
    def rows(self, version: int | None = None) -> OutputRows:
        """The output's rows at `version` (the latest: None)."""

    @abstractmethod
    def merging(self) -> Callable[[], Sink]:
        """What makes a sink that merges each committed unit's rows by id (one per
        writing process)."""

    @abstractmethod
    def delete(self, ids: Iterable[Any]) -> int:
        """Delete the rows of `ids` (ids gone already are no matter); return how many ids
        were named."""

    @abstractmethod
    def id_parts(self, directory: AnyPath) -> Sink:
        """The sink of the sync's own parts in `directory`: each unit's ids alone."""

    @abstractmethod
    def finish(self, phase: Callable[[str], None]) -> None:
        """Every unit is merged and the deletes are done: compact, index."""

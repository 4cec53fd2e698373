"""What an incremental run may delete (`--since`: a Parquet change set, or a LanceDB table
synced in place).

An id of the previous output that the new output does not hold is gone, and deleted, only
when every input was read whole: then the input no longer holds it. It is unknown, not
gone, when its record could not be read (a bad record that names the id: a null text, ...).
And while any input holds a record whose id could not be read (a file cut short, a
malformed line, a record without an id) or lies in a directory that could not be listed,
every id the new output does not hold is unknown: the unread part of the input may hold
any of them, ids that moved from a file read whole included. Unknown ids keep their
previous rows; their deletes wait for a run that reads every input whole.

Deletes come last, once every unit is done, and only when the run is within its limits:
a run over `--max-bad-records` deletes nothing, and so does one that would delete more
than `--max-deletes` allows (a count, or a fraction of the previous output's rows). Rows
that are not deleted stay where they are (a table synced in place) or are written to the
new output as they were (a Parquet change set), so that the new output holds what a store
holds after the change set is applied.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from bulkembed.errors import OutputError
from bulkembed.schema import CONTENT_HASH, EMBEDDING_COLUMNS
from bulkembed.sources import IdKey, SeenIds
from bulkembed.sources.records import DUPLICATE_ID, known_id
from bulkembed.wording import counted, percent

MAX_DELETES_OPTION = "--max-deletes"
MAX_BAD_RECORDS_OPTION = "--max-bad-records"


def allowed_deletes(limit: float | None, previous_rows: int) -> float:
    """How many deletes `--max-deletes` allows against an output of `previous_rows`."""
    if limit is None:
        return float("inf")
    return limit * previous_rows if 0 < limit < 1 else limit


def describe_limit(limit: float | None) -> str:
    return "all" if limit is None else f"{limit:g}"


class PreviousIds(Protocol):
    """A previous output's ids, a table at a time."""

    def id_tables(self) -> Iterator[pa.Table]: ...


class Unread:
    """What a run could not read: the ids of its bad records, and whether some input (a
    file, a directory) holds records whose ids could not be read (`anything`: then any id
    may be among them)."""

    def __init__(self, ids: SeenIds, anything: bool) -> None:
        self.ids = ids
        self.anything = anything

    @classmethod
    def of(
        cls, bad_records: Iterable[dict[str, Any]], unread_directories: bool, key: IdKey
    ) -> Unread:
        """From the quarantine's lines (`BadRecord.fields`), and whether an input directory
        could not be listed; ids are found by their hashes keyed by `key`."""
        ids: list[str] = []
        anything = unread_directories
        for fields in bad_records:
            if fields.get("reason") == DUPLICATE_ID:
                # The id is in the output: its first record's.
                continue
            if known_id(fields.get("id")):
                ids.append(str(fields["id"]))
            else:
                anything = True
        named = SeenIds(key)
        named.add_all([pa.array(ids, pa.string())])
        return cls(named, anything)

    def keeps(self, hashes: np.ndarray) -> np.ndarray:
        """Which ids (their hashes, [ids, 2]) of the previous output are unknown: not to
        delete."""
        return self.ids.contains(hashes) | self.anything


@dataclass(frozen=True, slots=True)
class Deletions:
    """What an incremental run did with the previous output's ids that its output does
    not hold: `deleted` (or listed as deletes), `kept` because they could not be read, and
    `withheld` because deleting them was over a limit (`held_by` names its option).
    Rows kept or withheld stay in the output."""

    deleted: int
    kept: int
    withheld: int = 0
    held_by: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, fields: dict[str, Any] | None) -> Deletions | None:
        return None if fields is None else cls(**fields)

    def message(self, previous_rows: int, limit: float | None) -> str:
        """The one line of a sync that `--max-deletes` stopped."""
        share = f"{percent(self.withheld, previous_rows)} of" if previous_rows else "of"
        verb = "is" if self.withheld == 1 else "are"
        return (
            f"{counted(self.withheld, 'id')} of the previous output ({share} its "
            f"{previous_rows} rows) {verb} gone from the input, over {MAX_DELETES_OPTION} "
            f"{describe_limit(limit)}: nothing was deleted (new and changed documents were "
            f"written); run the same command with {MAX_DELETES_OPTION} {self.withheld} "
            "(or all) to delete them"
        )


@dataclass(frozen=True, slots=True)
class Missing:
    """One table of the previous output: its ids, and which of them are gone (to delete)
    and which are kept (unknown: their record or file could not be read)."""

    number: int
    ids: pa.ChunkedArray
    gone: np.ndarray
    kept: np.ndarray


def missing_ids(
    previous: PreviousIds, output_ids: Iterable[pa.Array], unread: Unread, key: IdKey
) -> Iterator[Missing]:
    """The previous output's ids that `output_ids` lacks, table by table, sorted into
    gone and kept. Ids are compared by their 128-bit hashes keyed by the run's `key`
    (`SeenIds`): no id can be made to pass for another."""
    held = SeenIds(key)
    held.add_all(output_ids)
    for number, table in enumerate(previous.id_tables()):
        ids = table.column("id")
        hashes = key.hashes(ids)
        missing = ~held.contains(hashes)
        kept = missing & unread.keeps(hashes)
        yield Missing(number, ids, missing & ~kept, kept)


def decide(
    gone: int,
    kept: int,
    previous_rows: int,
    max_deletes: float | None,
    over_bad_records: bool,
) -> Deletions:
    """Whether the `gone` ids are deleted: not when the run is over its bad-record limit,
    nor when they are more than `--max-deletes` allows."""
    if gone and over_bad_records:
        return Deletions(0, kept, gone, MAX_BAD_RECORDS_OPTION)
    if gone > allowed_deletes(max_deletes, previous_rows):
        return Deletions(0, kept, gone, MAX_DELETES_OPTION)
    return Deletions(gone, kept)


def kept_rows(
    missing: Missing,
    which: np.ndarray,
    schema: pa.Schema,
    rows_at: Callable[[int, np.ndarray], pa.Table] | None,
) -> pa.Table:
    """The rows of `missing` at `which` (a mask) as the new output stores them: `schema`'s
    columns, from the previous output (`rows_at(table number, positions)` gives its rows;
    a schema of ids alone needs none). A passthrough column it lacks, or holds in a type
    that does not convert, is null."""
    kind = schema.field("id").type
    try:
        ids = missing.ids.filter(pa.array(which)).cast(kind)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise OutputError(
            f"the previous output's ids cannot be kept in this output, whose ids are {kind} "
            f"({e}): run without --since"
        ) from e
    if schema.names == ["id"]:
        return pa.Table.from_arrays([ids], schema=schema)
    assert rows_at is not None, "rows beyond their ids need the previous output's rows"
    rows = rows_at(missing.number, np.flatnonzero(which))
    columns = [ids]
    for field in schema:
        if field.name == "id":
            continue
        if field.name in (*EMBEDDING_COLUMNS, CONTENT_HASH):
            # The same settings made both outputs: their vectors have one type.
            columns.append(rows.column(field.name).cast(field.type))
            continue
        try:
            columns.append(rows.column(field.name).cast(field.type))
        except (KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError):
            columns.append(pa.nulls(rows.num_rows, field.type))
    return pa.Table.from_arrays(columns, schema=schema)

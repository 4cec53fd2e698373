"""Incremental runs against a previous output (`--since PREV`).

Every output row keeps `content_hash`: BLAKE2b-128 of the exact text the model read (prompt
included, lowercased where the model lowercases), computed where the text is tokenized
(`tokenize.content_digest`). An incremental run reads PREV's ids and hashes once, into a lookup on
disk (`bulkembed.incremental.lookup`, 41 bytes per document), and then, chunk by chunk, after
tokenizing:

- an id PREV does not have is new, and embedded;
- an id whose hash differs is changed, and embedded;
- an id whose hash is the same is unchanged: its dense, sparse and multi-vector columns are
  copied from PREV's row (`bulkembed.incremental.carry`), and the model never sees it.

Ids of PREV that the input no longer has are not written: `bulkembed.incremental.deletions` says
which of them are deleted and which are kept because they could not be read.

With an output whose kind keeps one (Parquet), the run also writes the change set that takes
PREV to the new output, in the run directory (`bulkembed.sinks.change_set`).

A bad record of an incremental run says in `previous` that PREV's rows it may have held are
not deleted.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from bulkembed.contracts import RowCounts
from bulkembed.errors import UsageError
from bulkembed.incremental.carry import CarryOver, TableCarryOver
from bulkembed.incremental.lookup import PartRows, PreviousLookup
from bulkembed.run_dir import RunDirectory, describe_changes
from bulkembed.schema import CONTENT_HASH, digests
from bulkembed.sinks import PreviousParts, part_path
from bulkembed.sources import IdKey
from bulkembed.storage import AnyPath, remove_scratch, scratch_folder

# Settings that may differ from PREV's: they change which documents there are or which
# input columns are copied, not what a document's vectors are.
_FREE_SETTINGS = ("inputs", "limit", "units", "keep_columns", "since")

if TYPE_CHECKING:
    from bulkembed.sinks import OutputRows

    pass


# The setting of the model's weights: a `--since` output made with other weights is taken,
# where `PreviousOutput.other_weights` says so, with none of its vectors reused.
_WEIGHTS = "model_version"


def check_previous(
    run: RunDirectory, label: str, fingerprint: dict[str, Any], other_weights: bool = False
) -> bool:
    """Refuse a `--since` output that is not a finished bulkembed output made with the same
    settings as `fingerprint` (but for the free ones, and, where `other_weights` allows it,
    the model's weights). Whether its weights are other ones."""
    if not run.config_path.exists():
        raise UsageError(f"--since {label}: not a bulkembed output directory")
    if not run.is_complete():
        raise UsageError(
            f"--since {label}: that run is unfinished; run its command again to finish it"
        )
    before = run.read_config().get("fingerprint", {})
    free = (*_FREE_SETTINGS, _WEIGHTS) if other_weights else _FREE_SETTINGS
    changes = describe_changes(
        {k: v for k, v in before.items() if k not in free},
        {k: v for k, v in fingerprint.items() if k not in free},
    )
    if changes:
        raise UsageError(
            f"--since {label} was made with other settings ({'; '.join(changes)}): "
            "its vectors cannot be reused; run without --since"
        )
    return before.get(_WEIGHTS) != fingerprint.get(_WEIGHTS)


@dataclass(frozen=True, slots=True)
class KnownSizes:
    """The sizes of the vectors a model gives: dense, and per token (None: not given)."""

    dense_dim: int | None
    multivector_dim: int | None


class PreviousOutput:
    """A finished Parquet output made with the same settings, to carry unchanged rows from.

    `rows` is its number of documents; `run` its run directory; `lookup` its documents
    sorted by id hash (keyed by the run's `id_key`), on disk (`bulkembed.incremental.lookup`), in a
    temporary folder removed by `close`; `carrier` carries its unchanged rows over.

    An output made with other weights of the same model (fine-tuned weights, weights changed in
    place: `other_weights`) is taken too, but none of its vectors is: every document is
    embedded again, as changed, and its ids still decide what is deleted."""

    def __init__(self, path: AnyPath, fingerprint: dict[str, Any], id_key: IdKey) -> None:
        self.id_key = id_key
        self.run = RunDirectory(path)
        self.other_weights = check_previous(self.run, str(path), fingerprint, other_weights=True)
        self.path: AnyPath | str = path
        done = self.run.done_units().values()
        self.parts = PreviousParts([part_path(path, r.part) for r in done if r.rows])
        self._start()

    def _start(self) -> None:
        self._folder = scratch_folder("previous")
        self.rows = 0  # counted as the lookup is built
        try:
            self.lookup = PreviousLookup.build(self._part_rows(), self._folder, self.id_key)
        except BaseException:
            self.close()
            raise
        self.carrier = self._carrier()

    def _carrier(self) -> CarryOver:
        """What carries PREV's unchanged rows over."""
        return CarryOver(self.lookup, self.parts)

    def close(self) -> None:
        """Remove the lookup's folder."""
        remove_scratch(self._folder)

    def sizes(self) -> KnownSizes | None:
        """The sizes of PREV's vectors, as its parts' schema records them (None without a
        part): a run with the same settings writes vectors of these sizes."""
        if not self.parts or self.other_weights:
            return None
        schema = self.parts.schema()
        dimension = (schema.metadata or {}).get(b"bulkembed.dimension")
        if dimension is None:
            return None
        names = schema.names
        multivector = None
        if "multivector" in names:
            multivector = schema.field("multivector").type.value_type.list_size
        return KnownSizes(int(dimension) if dimension else None, multivector)

    def id_tables(self) -> Iterator[pa.Table]:
        """PREV's ids, a part at a time."""
        for table, _ in self._labelled_tables(["id"]):
            yield table

    def _labelled_tables(
        self, columns: list[str]
    ) -> Iterator[tuple[pa.Table, dict[str, Any] | None]]:
        """Each part's `columns` (of its ids and content hashes), and its label."""
        return self.parts.labelled(columns)

    def _part_rows(self) -> Iterator[PartRows]:
        """Each part's ids and content hashes, and its rows' counts where its label has
        them (not known for a part written before labels held them)."""
        for table, label in self._labelled_tables(["id", CONTENT_HASH]):
            count = table.num_rows
            self.rows += count
            keys = self.id_key.hashes(table.column("id"))
            counts = RowCounts.decode(label.get("counts"), count) if label else None
            try:
                hashes = digests(table.column(CONTENT_HASH))
            except ValueError:
                hashes = np.zeros(count, "S16")  # matches no text: embedded again
            if self.other_weights:
                hashes = np.zeros(count, "S16")
            yield PartRows(keys, hashes, counts or RowCounts.unknown(count))

    def rows_at(self, number: int, positions: np.ndarray) -> pa.Table:
        """Every column of the rows at `positions` of PREV's part `number`."""
        return self.parts.whole(number).take(pa.array(positions, pa.int64()))


class PreviousTable(PreviousOutput):
    """A LanceDB table that a finished run wrote, at `version` (the one before this run
    changed it), to carry unchanged rows from; `run` is the table's run directory."""

    def __init__(
        self,
        run: RunDirectory,
        rows: OutputRows,
        fingerprint: dict[str, Any],
        label: str,
        id_key: IdKey,
    ) -> None:
        self.id_key = id_key
        self.run = run
        self.other_weights = check_previous(run, label, fingerprint)
        self.path = label
        self.parts = PreviousParts([])
        self._rows = rows
        self._start()

    def _carrier(self) -> CarryOver:
        return TableCarryOver(self.lookup, self._rows)

    def _labelled_tables(
        self, columns: list[str]
    ) -> Iterator[tuple[pa.Table, dict[str, Any] | None]]:
        """The table's `columns`, whole (its rows are found by their offset), with no
        counts."""
        yield self._rows.read(columns), None

    def sizes(self) -> KnownSizes | None:
        """Not read from a table: the model gives them."""
        return None

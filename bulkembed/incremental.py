"""Content hashes, and incremental runs against a previous output (`--since PREV`).

Every output row keeps `content_hash`: BLAKE2b-128 of the exact text the model read (prompt
included, lowercased where the model lowercases). An incremental run reads PREV's ids and
hashes once, into sorted arrays (32 bytes per document), and then, record by record:

- an id PREV does not have is new, and embedded;
- an id whose hash differs is changed, and embedded;
- an id whose hash is the same is unchanged: its dense, sparse and multi-vector columns are
  copied from PREV's row, and the model never sees it.

Ids of PREV that the input no longer has are not written: they are the deleted ones. PREV's
vectors are read a row group at a time (a few hundred rows: bulkembed writes one per chunk),
as the records that need them come; the run's own order of units usually matches PREV's, so
each row group is read once.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bulkembed.errors import UsageError
from bulkembed.run_dir import RunDirectory, describe_changes
from bulkembed.schema import CONTENT_HASH, EMBEDDING_COLUMNS
from bulkembed.sinks import ParquetSink
from bulkembed.sources import Chunk
from bulkembed.sources.filters import id_hash
from bulkembed.sources.records import Carried
from bulkembed.storage import AnyPath, parquet_file
from bulkembed.tokenize import TokenizerSettings

# Settings that may differ from PREV's: they change which documents there are or which
# input columns are copied, not what a document's vectors are.
_FREE_SETTINGS = ("inputs", "limit", "units", "keep_columns", "since")
# PREV's row groups held in memory at once.
_CACHED_GROUPS = 4


def content_hash(text: str) -> str:
    """32 hex digits: BLAKE2b-128 of the text's UTF-8 bytes."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


def hash_contents(chunks: Iterable[Chunk], settings: TokenizerSettings) -> Iterator[Chunk]:
    """Set each chunk's `hashes`: the content hash of what the model reads of each text."""
    for chunk in chunks:
        chunk.hashes = [content_hash(settings.model_text(t)) for t in chunk.texts]
        yield chunk


class PreviousOutput:
    """A finished Parquet output made with the same settings, to carry unchanged rows from.

    `rows` is its number of documents. The lookup arrays are sorted by id hash; ids of PREV
    that share a 64-bit hash (odds about n² / 2⁶⁵) are left out of them, so those documents
    are embedded again, as if new."""

    def __init__(self, path: AnyPath, fingerprint: dict[str, Any]) -> None:
        run = RunDirectory(path)
        if not run.config_path.exists():
            raise UsageError(f"--since {path}: not a bulkembed output directory")
        if not run.is_complete():
            raise UsageError(
                f"--since {path}: that run is unfinished; run its command again to finish it"
            )
        before = run.read_config().get("fingerprint", {})
        changes = describe_changes(
            {k: v for k, v in before.items() if k not in _FREE_SETTINGS},
            {k: v for k, v in fingerprint.items() if k not in _FREE_SETTINGS},
        )
        if changes:
            raise UsageError(
                f"--since {path} was made with other settings ({'; '.join(changes)}): "
                "its vectors cannot be reused; run without --since"
            )
        self.path = path
        parts = ParquetSink(path)
        self.parts = [parts.part_path(r.part) for r in run.done_units().values() if r.rows]
        self.rows = 0
        self._files: dict[int, tuple[pq.ParquetFile, np.ndarray]] = {}
        self._cache: OrderedDict[tuple[int, int], pa.Table] = OrderedDict()
        self._load_lookup()

    def _load_lookup(self) -> None:
        ids, hashes, parts, rows = [], [], [], []
        for number, path in enumerate(self.parts):
            file = parquet_file(path)
            if CONTENT_HASH not in file.schema_arrow.names:
                raise UsageError(
                    f"--since: {path} has no {CONTENT_HASH} column (written by an older "
                    "bulkembed); run without --since once"
                )
            table = file.read(columns=["id", CONTENT_HASH])
            count = table.num_rows
            ids.append(np.fromiter(map(id_hash, table.column("id").to_pylist()), np.uint64, count))
            digests = table.column(CONTENT_HASH).to_pylist()
            hashes.append(np.array([bytes.fromhex(h) for h in digests], dtype="S16"))
            parts.append(np.full(count, number, np.int32))
            rows.append(np.arange(count, dtype=np.int32))
            self.rows += count
        keys = np.concatenate(ids) if ids else np.empty(0, np.uint64)
        order = np.argsort(keys, kind="stable")
        keys = keys[order]
        unique = np.ones(len(keys), dtype=bool)
        shared = keys[1:] == keys[:-1]
        unique[1:] &= ~shared
        unique[:-1] &= ~shared
        order = order[unique]
        self._keys = keys[unique]
        self._hashes = np.concatenate(hashes)[order] if hashes else np.empty(0, "S16")
        self._parts = np.concatenate(parts)[order] if parts else np.empty(0, np.int32)
        self._rows = np.concatenate(rows)[order] if rows else np.empty(0, np.int32)

    def _find(self, ids: list[Any]) -> np.ndarray:
        """For each id, its index in the lookup arrays, or -1."""
        if not len(self._keys):
            return np.full(len(ids), -1, dtype=np.int64)
        keys = np.fromiter(map(id_hash, ids), np.uint64, len(ids))
        found = np.minimum(np.searchsorted(self._keys, keys), len(self._keys) - 1)
        return np.where(self._keys[found] == keys, found, -1)

    def _file(self, number: int) -> tuple[pq.ParquetFile, np.ndarray]:
        """PREV's part `number`, and the first row of each of its row groups."""
        if number not in self._files:
            file = parquet_file(self.parts[number])
            sizes = [file.metadata.row_group(g).num_rows for g in range(file.num_row_groups)]
            self._files = {number: (file, np.cumsum([0, *sizes[:-1]]))}
        return self._files[number]

    def _group(self, number: int, group: int) -> pa.Table:
        """The output columns of one row group of PREV's part `number`."""
        key = (number, group)
        table = self._cache.get(key)
        if table is None:
            file, _ = self._file(number)
            columns = [c for c in EMBEDDING_COLUMNS if c in file.schema_arrow.names]
            table = file.read_row_group(group, columns=columns)
            self._cache[key] = table
            if len(self._cache) > _CACHED_GROUPS:
                self._cache.popitem(last=False)
        self._cache.move_to_end(key)
        return table

    def _embeddings(self, entries: np.ndarray) -> pa.Table:
        """PREV's output columns for lookup entries, in their order."""
        pieces = []
        for entry in entries:
            number, row = int(self._parts[entry]), int(self._rows[entry])
            _, starts = self._file(number)
            group = int(np.searchsorted(starts, row, side="right")) - 1
            pieces.append((number, group, row - int(starts[group])))
        tables = []
        start = 0
        for end in range(1, len(pieces) + 1):
            if end == len(pieces) or pieces[end][:2] != pieces[start][:2]:
                rows = pa.array([p[2] for p in pieces[start:end]], pa.int64())
                tables.append(self._group(*pieces[start][:2]).take(rows))
                start = end
        return pa.concat_tables(tables)

    def carry_over(self, chunks: Iterable[Chunk]) -> Iterator[Chunk]:
        """Move each chunk's unchanged records to `carried`, count its changed ones."""
        for chunk in chunks:
            entries = self._find(chunk.ids.to_pylist())
            known = entries >= 0
            if not known.any():
                yield chunk
                continue
            digests = np.array([bytes.fromhex(h) for h in chunk.hashes], dtype="S16")
            same = known & (self._hashes[np.where(known, entries, 0)] == digests)
            chunk.changed = int((known & ~same).sum())
            if same.any():
                unchanged = np.flatnonzero(same)
                records = chunk.rows(unchanged.tolist())
                records.texts = []  # not embedded: not needed
                chunk.carried = Carried(records, self._embeddings(entries[unchanged]))
                chunk.keep(np.flatnonzero(~same).tolist())
            yield chunk

"""A LanceDB table's surroundings: the lancedb and lance modules, where a table on object
storage is reached, the data files of a version and its ids, the embedding function its
schema names, and the indexes built once every unit is in (`--index`, `--fts`)."""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from bulkembed.errors import OutputError
from bulkembed.schema import EMBEDDING_FUNCTION, ENCODER_KEY
from bulkembed.storage import StorageOptions

DEFAULT_TABLE = "embeddings"

# IVF trains each partition on up to this many rows.
ROWS_PER_PARTITION = 256
# From this many rows `auto` takes IVF_PQ (compressed); below, IVF_HNSW_SQ.
PQ_FROM_ROWS = 1_000_000
# IVF_HNSW_SQ: one partition (one graph) per this many rows.
ROWS_PER_HNSW_PARTITION = 1_000_000
# Reads of a table's ids begun again because its files were compacted meanwhile.
READ_ATTEMPTS = 8


@dataclass(frozen=True, slots=True)
class IndexSettings:
    """`--index`: vector indexes to build once every unit is in."""

    kind: str = "auto"
    partitions: int | None = None
    metric: str = "cosine"

    def choose(self, rows: int) -> tuple[str, int]:
        """The index type and number of IVF partitions for a table of `rows` rows."""
        kind = self.kind
        if kind == "auto":
            kind = "ivf_pq" if rows >= PQ_FROM_ROWS else "ivf_hnsw_sq"
        if self.partitions is not None:
            return kind, self.partitions
        trainable = max(1, rows // ROWS_PER_PARTITION)
        if kind == "ivf_hnsw_sq":
            return kind, min(trainable, max(1, rows // ROWS_PER_HNSW_PARTITION))
        return kind, min(trainable, max(1, round(math.sqrt(rows))))


def with_embedding_function(schema: pa.Schema, text_column: str) -> pa.Schema:
    """The schema of a table, naming bulkembed's embedding function for its `vector`
    column, with `text_column` as its source, where the run recorded its encoder and the
    vectors are floats: LanceDB embeds text with it (`lance_function`)."""
    metadata = dict(schema.metadata or {})
    encoder = metadata.get(ENCODER_KEY.encode())
    if encoder is None or "vector" not in schema.names:
        return schema
    if not pa.types.is_floating(schema.field("vector").type.value_type):
        return schema
    function = {
        "name": EMBEDDING_FUNCTION,
        "model": json.loads(encoder),
        "source_column": text_column,
        "vector_column": "vector",
    }
    metadata[b"embedding_functions"] = json.dumps([function]).encode()
    return schema.with_metadata(metadata)


def lance_modules() -> Any:
    """The lancedb and lance modules, or a one-line error naming the extra."""
    try:
        import lance
        import lancedb
    except ImportError:
        raise OutputError(
            "LanceDB output needs the lance extra: pip install 'bulkembed[lance]'"
        ) from None
    # Both warn at every fork of a process that imported them: a process a run forks never
    # touches a table.
    warnings.filterwarnings("ignore", "lance is not fork-safe", UserWarning)
    warnings.filterwarnings("ignore", "lancedb fork support is experimental", RuntimeWarning)
    # Lance warns, on every index it reads the statistics of, that centroids will leave
    # them; bulkembed reads no centroids: the new behaviour, unless the user chose.
    os.environ.setdefault("LANCE_INCLUDE_VECTOR_CENTROIDS", "false")
    from bulkembed.sinks.lance_function import register

    # The tables runs write name bulkembed's embedding function: LanceDB looks it up when
    # it writes to them.
    register()
    return lancedb, lance


def _index_config(kind: str, partitions: int, metric: str) -> Any:
    from lancedb.index import HnswSq, IvfFlat, IvfPq

    config = {"ivf_pq": IvfPq, "ivf_hnsw_sq": HnswSq, "ivf_flat": IvfFlat}[kind]
    return config(distance_type=metric, num_partitions=partitions)


def lance_storage_options(options: StorageOptions, scheme: str) -> dict[str, str]:
    """`--storage-option`s as Lance's object store takes them, for a store of `scheme`.
    Credentials are not among them: Lance reads them from the environment
    (`AWS_ACCESS_KEY_ID`, ...) as each cloud's tools do."""
    mapped = {}
    endpoint = options.endpoint(scheme)
    if endpoint:
        mapped["endpoint"] = endpoint
        if endpoint.startswith("http://"):
            mapped["allow_http"] = "true"
    if scheme in ("az", "abfs") and options.get("account"):
        mapped["account_name"] = str(options.get("account"))
    if options.get("region"):
        mapped["region"] = str(options.get("region"))
    if options.anonymous:
        mapped["skip_signature"] = "true"
    return mapped


def build_indexes(
    table: Any,
    index: IndexSettings | None,
    fts_column: str | None,
    phase: Callable[[str], None],
) -> None:
    """Build the vector indexes of `index` and the full-text index on `fts_column` (each
    step named to `phase`) on a table that holds every row."""
    rows = table.count_rows()
    names = table.schema.names
    if index is not None and rows:
        kind, partitions = index.choose(rows)
        for column, metric in (("vector", index.metric), ("multivector", "cosine")):
            if column in names:
                phase(f"building the {kind} index on {column} ({rows:,} rows)")
                config = _index_config(kind, partitions, metric)
                table.create_index(column, config=config)
    if fts_column is not None:
        from lancedb.index import FTS

        phase(f"building the full-text index on {fts_column}")
        table.create_index(fts_column, config=FTS(), replace=True)


def fragment_files(fragment: Any) -> frozenset[str]:
    """The names of a fragment's data files (of its `FragmentMetadata`)."""
    return frozenset(f.path for f in fragment.files)


def present_files(dataset: Any) -> frozenset[str]:
    """Every data file of a dataset's version."""
    return frozenset().union(*table_files(dataset).values())


def table_files(dataset: Any) -> dict[int, frozenset[str]]:
    """The data files of each fragment of a dataset's version, by fragment id."""
    return {f.fragment_id: fragment_files(f.metadata) for f in dataset.get_fragments()}


def fragment_ids(
    latest: Callable[[], Any], others: frozenset[str], description: str
) -> Iterator[pa.Array]:
    """The ids of the fragments of the `latest()` dataset that hold none of the data files
    `others`, an array at a time. Where the table is compacted while they are read (the run
    that finishes it deletes the files the read began on), they are read again from the
    compacted table: the ids read before come twice."""
    dataset = latest()
    for _ in range(READ_ATTEMPTS):
        try:
            for fragment in dataset.get_fragments():
                if not fragment_files(fragment.metadata) & others:
                    for batch in fragment.to_batches(columns=["id"]):
                        yield batch.column("id")
            return
        except (OSError, pa.ArrowException):
            moved = latest()
            if moved.version == dataset.version:
                raise
            dataset = moved
    raise OutputError(f"cannot read the ids of {description}: it kept being compacted")

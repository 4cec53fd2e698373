"""The output contract: Arrow schema of the parts, and embeddings turned into record batches.

| column        | Arrow type                                                   |
| ------------- | ------------------------------------------------------------ |
| `id`          | string or int64                                              |
| `dense`       | fixed_size_list<float32, D>                                  |
| `sparse`      | struct<indices: list<int32>, values: list<float32>>          |
| `multivector` | list<fixed_size_list<float32, d>>                            |
| `content_hash`| string: 32 hex digits of BLAKE2b-128 of the text the model saw |
| passthrough   | as in the input (`--keep-columns`)                           |

`--dtype-out float16` makes dense and multivector items float16; `--quantize` makes dense
fixed_size_list<int8 or uint8, D>, or <int8 or uint8, ceil(D / 8)> for binary and ubinary
(see `OutputFormat`).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from bulkembed.contracts import Embeddings

SPARSE_TYPE = pa.struct(
    [pa.field("indices", pa.list_(pa.int32())), pa.field("values", pa.list_(pa.float32()))]
)


EMBEDDING_COLUMNS = ("dense", "sparse", "multivector")
CONTENT_HASH = "content_hash"
# The schema metadata key of the settings of the encoder that made the vectors
# (`bulkembed.output.recorded`).
ENCODER_KEY = "bulkembed.encoder"
# The name of bulkembed's embedding function in LanceDB's registry, which tables name. A
# process that has not registered it gets LanceDB's `KeyError` of this name: it says what to
# do. Tables written before name it `bulkembed` (`EARLIER_EMBEDDING_FUNCTION`).
EMBEDDING_FUNCTION = "bulkembed: import bulkembed.lancedb first"
EARLIER_EMBEDDING_FUNCTION = "bulkembed"


def output_schema(
    id_type: pa.DataType,
    dense: pa.DataType | None = None,
    sparse: bool = False,
    multivector: pa.DataType | None = None,
    passthrough: dict[str, pa.DataType] | None = None,
    metadata: dict[str, str] | None = None,
) -> pa.Schema:
    """`id`, each output that is produced (dense, sparse, multivector), `content_hash`, then
    the passthrough columns, with `metadata` as the schema's key-value metadata. `dense` and
    `multivector` are their column types (see `OutputFormat`)."""
    fields = [pa.field("id", id_type, nullable=False)]
    if dense is not None:
        fields.append(pa.field("dense", dense))
    if sparse:
        fields.append(pa.field("sparse", SPARSE_TYPE))
    if multivector is not None:
        fields.append(pa.field("multivector", multivector))
    fields.append(pa.field(CONTENT_HASH, pa.string(), nullable=False))
    fields.extend(pa.field(name, kind) for name, kind in (passthrough or {}).items())
    return pa.schema(fields, metadata=metadata)


# Each byte value's two lowercase hex digits.
_HEX = np.array([f"{b:02x}".encode() for b in range(256)], dtype="S2")


def hex_strings(digests: np.ndarray) -> pa.StringArray:
    """Content hashes as the output stores them (32 hex digits) from 16-byte digests."""
    count = len(digests)
    raw = np.frombuffer(np.ascontiguousarray(digests, dtype="S16").tobytes(), np.uint8)
    data = _HEX[raw].tobytes()
    offsets = np.arange(0, 32 * count + 1, 32, dtype=np.int32)
    return pa.StringArray.from_buffers(count, pa.py_buffer(offsets), pa.py_buffer(data))


# Each ASCII byte's value as a hex digit (0 for a byte that is not one).
_DIGIT = np.zeros(256, np.uint8)
_DIGIT[np.frombuffer(b"0123456789abcdef", np.uint8)] = np.arange(16, dtype=np.uint8)
_DIGIT[np.frombuffer(b"ABCDEF", np.uint8)] = np.arange(10, 16, dtype=np.uint8)


def digests(hex_column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """16-byte digests from content hashes as the output stores them (`hex_strings`), a
    column at a time; a value that is not 32 characters raises ValueError.

    >>> digests(hex_strings(np.array([bytes(range(16))], dtype="S16"))) == bytes(range(16))
    array([ True])
    """
    column = hex_column.combine_chunks() if isinstance(hex_column, pa.ChunkedArray) else hex_column
    column = column.cast(pa.string())
    count = len(column)
    if count == 0:
        return np.empty(0, "S16")
    if column.null_count:
        raise ValueError("a content hash is null")
    offsets = np.frombuffer(column.buffers()[1], np.int32, count + 1, column.offset * 4)
    if not (np.diff(offsets) == 32).all():
        raise ValueError("a content hash is not 32 hex digits")
    data = np.frombuffer(column.buffers()[2], np.uint8, 32 * count, int(offsets[0]))
    pairs = _DIGIT[data].reshape(count, 16, 2)
    raw = (pairs[:, :, 0] << 4) | pairs[:, :, 1]
    return np.ascontiguousarray(raw).view("S16").reshape(count)


def _offsets(lengths: list[int]) -> pa.Array:
    return pa.array(np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]), pa.int32())


def _vectors(rows: np.ndarray, kind: pa.FixedSizeListType) -> pa.FixedSizeListArray:
    flat = pa.array(np.ascontiguousarray(rows).reshape(-1), type=kind.value_type)
    return pa.FixedSizeListArray.from_arrays(flat, kind.list_size)


def record_batch(
    ids: pa.Array,
    embeddings: Embeddings,
    schema: pa.Schema,
    hashes: np.ndarray,
    passthrough: dict[str, pa.Array],
) -> pa.RecordBatch:
    """Rows for `schema` from ids (of the schema's id type), their embeddings, content
    hashes (16-byte digests) and passthrough values, all in the same order."""
    columns: list[pa.Array] = [ids]
    for field in schema:
        if field.name == CONTENT_HASH:
            columns.append(hex_strings(hashes))
        elif field.name in passthrough:
            columns.append(passthrough[field.name])
        elif field.name == "dense":
            assert embeddings.dense is not None
            columns.append(_vectors(embeddings.dense, field.type))
        elif field.name == "sparse":
            assert embeddings.sparse is not None
            sparse = embeddings.sparse
            offsets = pa.array(sparse.offsets, pa.int32())
            indices, values = sparse.indices, sparse.values
            columns.append(
                pa.StructArray.from_arrays(
                    [
                        pa.ListArray.from_arrays(offsets, pa.array(indices)),
                        pa.ListArray.from_arrays(offsets, pa.array(values)),
                    ],
                    fields=list(SPARSE_TYPE),
                )
            )
        elif field.name == "multivector":
            assert embeddings.multivector is not None
            rows = embeddings.multivector
            kind = field.type.value_type
            flat = np.concatenate(rows) if rows else np.empty((0, kind.list_size), np.float32)
            vectors = _vectors(flat, kind)
            columns.append(pa.ListArray.from_arrays(_offsets([len(r) for r in rows]), vectors))
    return pa.RecordBatch.from_arrays(columns, schema=schema)

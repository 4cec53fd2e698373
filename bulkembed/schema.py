"""The output contract: Arrow schema of the parts, and embeddings turned into record batches."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from bulkembed.encoders.base import Embeddings


def output_schema(id_type: pa.DataType, dense_dim: int) -> pa.Schema:
    """`id` plus `dense` as `fixed_size_list<float32, D>`."""
    return pa.schema(
        [
            pa.field("id", id_type, nullable=False),
            pa.field("dense", pa.list_(pa.field("item", pa.float32()), dense_dim)),
        ]
    )


def record_batch(ids: pa.Array, embeddings: Embeddings, schema: pa.Schema) -> pa.RecordBatch:
    """Rows for `schema` from ids (of the schema's id type) and their embeddings, in order."""
    dense = np.ascontiguousarray(embeddings.dense, dtype=np.float32)
    dim = schema.field("dense").type.list_size
    vectors = pa.FixedSizeListArray.from_arrays(pa.array(dense.reshape(-1)), dim)
    return pa.RecordBatch.from_arrays([ids, vectors], schema=schema)

"""Speed of the JSON-lines stream writer (`--output - --stream-format jsonl`) on 1024-d vectors.

Writes batches of 256 rows (id, a 1024-d float32 vector, content hash) to /dev/null through
`StreamSink` on one core, and the same rows through the standard library's `json` (float64
text, as bulkembed wrote before) for comparison. Prints one JSON object: docs/s and bytes
per document of each, and whether every value the writer wrote reads back as the same
float32.

    python benchmarks/json_stream.py
"""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pyarrow as pa

from bulkembed.config import StreamFormat
from bulkembed.contracts import Embeddings
from bulkembed.schema import output_schema, record_batch
from bulkembed.sinks.stream import StreamSink, json_lines

DIMENSION = 1024
ROWS = 256
BATCHES = 40


def sample_batch(rng: np.random.Generator) -> pa.RecordBatch:
    """`ROWS` rows of unit vectors, as a run writes them."""
    vectors = rng.standard_normal((ROWS, DIMENSION)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    schema = output_schema(pa.string(), dense=pa.list_(pa.float32(), DIMENSION))
    ids = pa.array([f"doc-{i}" for i in range(ROWS)])
    digests = np.zeros(ROWS, dtype="S16")
    return record_batch(ids, Embeddings(dense=vectors), schema, digests, {})


def docs_per_s(write: object, batch: pa.RecordBatch) -> float:
    started = time.perf_counter()
    for _ in range(BATCHES):
        write(batch)  # type: ignore[operator]
    return BATCHES * ROWS / (time.perf_counter() - started)


def main() -> None:
    batch = sample_batch(np.random.default_rng(0))
    with open(os.devnull, "wb") as devnull:
        sink = StreamSink(devnull, StreamFormat.JSONL)
        writer = docs_per_s(lambda b: sink.write("stdout", b), batch)

        def stdlib(b: pa.RecordBatch) -> None:
            devnull.write(b"".join(json.dumps(r).encode() + b"\n" for r in b.to_pylist()))

        baseline = docs_per_s(stdlib, batch)
    lines = json_lines(batch).splitlines()
    read = np.array([json.loads(line)["dense"] for line in lines], dtype=np.float32)
    written = np.array(batch.column("dense").to_pylist(), dtype=np.float32)
    old_bytes = sum(len(json.dumps(r)) + 1 for r in batch.to_pylist()) / ROWS
    report = {
        "dimension": DIMENSION,
        "writer_docs_per_s": round(writer),
        "writer_bytes_per_doc": round(sum(len(line) + 1 for line in lines) / ROWS),
        "stdlib_json_docs_per_s": round(baseline),
        "stdlib_json_bytes_per_doc": round(old_bytes),
        "float32_exact": bool(np.array_equal(read, written)),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()

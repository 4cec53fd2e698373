"""Write embedded chunks into their units' parts, and commit each finished unit.

Chunks arrive in input order. Bad records go to the quarantine as they come; rows go into
their unit's part; when a unit's last chunk is written, its part is committed and then its
done-marker, with the unit's counts, is written to the ledger.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa

from bulkembed.checkpoint import RunDirectory, UnitRecord
from bulkembed.encoders import Embeddings
from bulkembed.schema import record_batch
from bulkembed.sinks import ParquetSink, Sink
from bulkembed.tokenize import TokenizedChunk


@dataclass(slots=True)
class _Tally:
    """Counts for the unit being written."""

    rows: int = 0
    bad_records: int = 0
    truncated: int = 0
    tokens: int = 0
    padded_tokens: int = 0


class PartWriter:
    """Writes embedded chunks in input order, quarantines bad records, commits finished units."""

    def __init__(self, run: RunDirectory, schema: pa.Schema) -> None:
        self.run = run
        self.schema = schema
        self.sink: Sink = ParquetSink(run.output, schema)
        self.tallies: dict[str, _Tally] = {}

    def write(self, tokenized: TokenizedChunk, embeddings: Embeddings, padded: np.ndarray) -> None:
        chunk = tokenized.chunk
        tally = self.tallies.setdefault(chunk.part, _Tally())
        for bad in chunk.bad:
            self.run.quarantine(bad, chunk.part)
        if len(chunk.ids):
            batch = record_batch(chunk.ids, embeddings, self.schema)
            self.sink.write(chunk.part, batch)
        tally.rows += len(chunk.ids)
        tally.bad_records += len(chunk.bad)
        tally.truncated += tokenized.truncated
        tally.tokens += int(tokenized.lengths.sum())
        tally.padded_tokens += int(padded.sum())
        if chunk.last_in_unit:
            self.sink.commit(chunk.part)
            self.run.mark_done(UnitRecord(chunk.part, **asdict(self.tallies.pop(chunk.part))))

    def close(self) -> None:
        self.sink.close()

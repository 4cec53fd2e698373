"""Gather tokenized chunks into windows, and embed a window batch by batch.

A window holds about `WINDOW_BATCHES` batches' worth of tokens. It is sorted by length and
packed into token-budget batches (`pack_batches`); each batch runs on the encoder, and the
outputs are put back in input order.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from bulkembed.batching import Batch, input_order, pack_batches
from bulkembed.encoders import Embeddings, Encoder, TokenBatch
from bulkembed.progress import Reporter, RunStats
from bulkembed.tokenize import TokenizedChunk

# A window holds this many full batches' worth of tokens before it is sorted and packed:
# enough that every length finds neighbours of a similar length, small enough to stay a
# few megabytes of token ids and to lose little work to a crash.
WINDOW_BATCHES = 32


def windows(chunks: Iterator[TokenizedChunk], window_tokens: int) -> Iterator[list[TokenizedChunk]]:
    window: list[TokenizedChunk] = []
    tokens = 0
    for chunk in chunks:
        window.append(chunk)
        tokens += int(chunk.lengths.sum())
        if tokens >= window_tokens:
            yield window
            window, tokens = [], 0
    if window:
        yield window


def embed_window(
    window: list[TokenizedChunk],
    encoder: Encoder,
    max_batch_tokens: int,
    stats: RunStats,
    reporter: Reporter,
) -> tuple[Embeddings, np.ndarray]:
    """Embeddings of every document of the window, and the length each was padded to,
    both in input order."""
    lengths = np.concatenate([c.lengths for c in window])
    if len(lengths) == 0:
        return Embeddings(), np.empty(0, dtype=np.int64)
    token_ids = np.concatenate([c.token_ids for c in window])
    starts = np.cumsum(lengths) - lengths
    batches = pack_batches(lengths, max_batch_tokens)
    outputs = []
    for batch in batches:
        sequences = [
            token_ids[s : s + n] for s, n in zip(starts[batch.indices], batch.lengths, strict=True)
        ]
        outputs.append(encoder.embed_within_memory(TokenBatch.from_sequences(sequences)))
        _count(stats, batch)
        reporter.update(stats)
    order = input_order(batches)
    padded = np.concatenate([np.full(b.size, b.lengths[0], dtype=np.int64) for b in batches])
    return Embeddings.concatenate(outputs).take(order), padded[order]


def _count(stats: RunStats, batch: Batch) -> None:
    stats.docs += batch.size
    stats.tokens += batch.tokens
    stats.padded_tokens += batch.padded_tokens
    stats.batches += 1

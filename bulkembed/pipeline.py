"""`embed_corpus`: read, tokenize, batch, embed and write a corpus. Orchestration only.

Tokenizer processes run ahead of the model on a bounded queue. Tokenized chunks gather into a
window of about `WINDOW_BATCHES` batches' worth of tokens; the window is sorted by length and
packed into token-budget batches, embedded, put back in input order, and written part by part.
A part is committed when the last chunk of its unit has been written.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from bulkembed import __version__
from bulkembed.batching import Batch, pack_batches, restore_order
from bulkembed.checkpoint import RunDirectory
from bulkembed.config import RunConfig, default_tokenize_workers
from bulkembed.encoders import Embeddings, Encoder, TokenBatch
from bulkembed.progress import Reporter, RunStats
from bulkembed.schema import output_schema, record_batch
from bulkembed.sinks import ParquetSink, Sink
from bulkembed.sources import Chunk, RecordReader, Shard, count_records, list_shards
from bulkembed.tokenize import TokenizedChunk, TokenizerPool, TokenizerSettings

# A window holds this many full batches' worth of tokens before it is sorted and packed:
# enough that every length finds neighbours of a similar length, small enough to stay a
# few megabytes of token ids.
WINDOW_BATCHES = 32


def part_name(chunk: Chunk) -> str:
    """The output part of a unit of work: `part-<shard>-<unit>`."""
    return f"part-{chunk.shard:05d}-{chunk.unit:06d}"


def _windows(
    chunks: Iterator[TokenizedChunk], window_tokens: int
) -> Iterator[list[TokenizedChunk]]:
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


class _Writer:
    """Writes embedded chunks in input order, quarantines bad records, commits finished units."""

    def __init__(self, run: RunDirectory, dim: int) -> None:
        self.run = run
        self.dim = dim
        self.sink: Sink | None = None
        self.schema: pa.Schema | None = None
        self.parts = 0

    def write(self, chunk: Chunk, dense: np.ndarray) -> None:
        for bad in chunk.bad:
            self.run.quarantine(bad)
        name = part_name(chunk)
        if len(chunk.ids):
            if self.sink is None:
                id_type = pa.int64() if pa.types.is_integer(chunk.ids.type) else pa.string()
                self.schema = output_schema(id_type, self.dim)
                self.sink = ParquetSink(self.run.output, self.schema)
            assert self.schema is not None
            self.sink.write(name, record_batch(chunk.ids, Embeddings(dense=dense), self.schema))
        if chunk.last_in_unit and self.sink is not None:
            self.sink.commit(name)
            self.parts += 1

    def close(self) -> None:
        if self.sink is not None:
            self.sink.close()


def _embed_window(
    window: list[TokenizedChunk],
    encoder: Encoder,
    max_batch_tokens: int,
    stats: RunStats,
    reporter: Reporter,
) -> np.ndarray:
    """Dense vectors of every document of the window, in input order."""
    lengths = np.concatenate([c.lengths for c in window])
    token_ids = np.concatenate([c.token_ids for c in window])
    starts = np.cumsum(lengths) - lengths
    if len(lengths) == 0:
        return np.empty((0, encoder.dim), dtype=np.float32)
    batches = pack_batches(lengths, max_batch_tokens)
    outputs = []
    for batch in batches:
        sequences = [
            token_ids[s : s + n] for s, n in zip(starts[batch.indices], batch.lengths, strict=True)
        ]
        outputs.append(encoder.embed(TokenBatch.from_sequences(sequences)).dense)
        _count(stats, batch)
        reporter.update(stats)
    return restore_order(batches, outputs)


def _count(stats: RunStats, batch: Batch) -> None:
    stats.docs += batch.size
    stats.tokens += batch.tokens
    stats.padded_tokens += batch.padded_tokens
    stats.batches += 1


def _start_counting(shards: list[Shard], limit: int | None, reporter: Reporter) -> None:
    """Count the documents in the background, for the progress bar's total and ETA."""

    def count() -> None:
        try:
            total = count_records(shards)
        except (OSError, EOFError):
            return
        reporter.set_total(min(total, limit) if limit is not None else total)

    threading.Thread(target=count, name="bulkembed-count", daemon=True).start()


def _summary(stats: RunStats, run_info: dict[str, Any], parts: int) -> dict[str, Any]:
    return {
        "docs": stats.docs,
        "tokens": stats.tokens,
        "seconds": round(stats.seconds, 3),
        "docs_per_s": round(stats.docs_per_s, 2),
        "tokens_per_s": round(stats.tokens_per_s, 1),
        "padding_efficiency": round(stats.padding_efficiency, 4),
        "batches": stats.batches,
        "bad_records": stats.bad_records,
        "truncated": stats.truncated,
        "parts": parts,
        **run_info,
    }


def embed_corpus(config: RunConfig, reporter: Reporter | None = None) -> dict[str, Any]:
    """Embed every document of `config.inputs` into `config.output`; return the summary."""
    from bulkembed.devices import resolve_device, resolve_dtype, return_freed_buffers_to_the_os
    from bulkembed.encoders import build_encoder
    from bulkembed.model_spec import resolve_model

    reporter = reporter or Reporter()
    run = RunDirectory(Path(config.output))
    shards = list_shards(config.inputs)
    spec = resolve_model(config)
    device = resolve_device(config.devices)
    dtype = resolve_dtype(config.dtype, device)
    run.prepare(config.overwrite)

    max_batch_tokens = spec.max_batch_tokens
    workers = config.tokenize_workers
    if workers is None:
        workers = default_tokenize_workers(device)
    run_info = {
        "model": spec.source,
        "recipe": spec.recipe,
        "device": device,
        "dtype": str(dtype).removeprefix("torch."),
        "pooling": spec.pooling.value,
        "normalize": spec.normalize,
        "max_length": spec.max_length,
        "max_batch_tokens": max_batch_tokens,
        "tokenize_workers": workers,
        "output": str(run.output),
    }
    spec_fields = {k: v for k, v in asdict(spec).items() if k != "tokenizer_json"}
    run.write_config(
        {"version": __version__, "run": asdict(config), "model": spec_fields, **run_info}
    )
    return_freed_buffers_to_the_os()
    encoder = build_encoder(spec, device, dtype)
    reporter.info(
        f"{spec.source} on {device} ({run_info['dtype']}), dim {encoder.dim}, "
        f"{spec.pooling.value} pooling, max length {spec.max_length}; batches of "
        f"{max_batch_tokens} tokens = {max(1, max_batch_tokens // spec.max_length)} docs at "
        f"max length; {workers} tokenizer process(es); {len(shards)} shard(s)"
    )

    stats = RunStats()
    writer = _Writer(run, encoder.dim)
    settings = TokenizerSettings(spec.tokenizer_json, spec.max_length, spec.prompt, spec.lowercase)
    reader = RecordReader(shards, config.text_column, config.id_column, limit=config.limit)
    reporter.start(stats)
    _start_counting(shards, config.limit, reporter)
    try:
        with TokenizerPool(settings, workers) as pool:
            for window in _windows(pool.map(reader), WINDOW_BATCHES * max_batch_tokens):
                dense = _embed_window(window, encoder, max_batch_tokens, stats, reporter)
                offset = 0
                for tokenized in window:
                    count = len(tokenized.lengths)
                    writer.write(tokenized.chunk, dense[offset : offset + count])
                    offset += count
                    stats.bad_records += len(tokenized.chunk.bad)
                    stats.truncated += tokenized.truncated
    finally:
        writer.close()
        reporter.close()
    summary = _summary(stats, run_info, writer.parts)
    run.write_summary(summary)
    reporter.finish(summary)
    return summary

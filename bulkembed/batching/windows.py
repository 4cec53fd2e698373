"""Gather tokenized chunks into windows, and embed windows as one stream of batches.

A window holds about `WINDOW_BATCHES` batches' worth of tokens. It is sorted by length and
packed into token-budget batches (`pack_batches`); the batches of window after window run
on the encoder back to back (`embed_packed`), and each window's outputs are put back in
input order. The first documents of the first window may come embedded already
(`EmbeddedHead`: the sample of the `--dtype auto` check): they are not embedded again.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from bulkembed.batching.packing import Batch, input_order, pack_batches
from bulkembed.batching.tokenize import TokenizedChunk
from bulkembed.contracts import Embeddings, TokenBatch
from bulkembed.reporting.progress import Reporter, RunStats

if TYPE_CHECKING:
    from bulkembed.encoders import Embedder

# A window holds this many full batches' worth of tokens before it is sorted and packed:
# enough that every length finds neighbours of a similar length, small enough to stay a
# few megabytes of token ids and to lose little work to a crash.
WINDOW_BATCHES = 32


# Multi-vector outputs keep one float32 vector per token until the window is written: the
# window then holds at most this many bytes of them (twice over while one window is written
# and the next embedded).
MULTIVECTOR_WINDOW_BYTES = 256 * 1024 * 1024


# A window also closes once it holds this many bytes of vectors carried over from a
# previous output (`--since`), however few documents it has to embed.
CARRIED_WINDOW_BYTES = 64 * 1024 * 1024

# And once it holds this many bytes of decoded images (about 1,300 of 224 x 224 pixels),
# however small the images are to the model in tokens.
PIXEL_WINDOW_BYTES = 192 * 1024 * 1024


# A window that ends at every unit's end (a stream's) holds this many documents at least:
# the `--dtype auto` check's sample is the first window's first 64.
UNIT_WINDOW_DOCUMENTS = 64


def window_tokens(budget: int, multivector_dim: int | None) -> int:
    """Tokens per window: `WINDOW_BATCHES` budgets, fewer when every token keeps a vector.

    >>> window_tokens(16384, None), window_tokens(16384, 1024)
    (524288, 65536)
    """
    tokens = WINDOW_BATCHES * budget
    if multivector_dim is not None:
        tokens = min(tokens, MULTIVECTOR_WINDOW_BYTES // (4 * multivector_dim))
    return max(tokens, budget)


def split_chunk(tokenized: TokenizedChunk, max_tokens: int) -> list[TokenizedChunk]:
    """Cut a chunk into pieces of at most `max_tokens` (one document at least), in order.
    The first piece carries the bad records, the count of changed records and of truncated
    ones, and the token counts of the carried-over records; carried-over records go with
    the piece they come before in the input, or the last; the last piece ends the unit."""
    lengths = tokenized.lengths
    if int(lengths.sum()) <= max_tokens:
        return [tokenized]
    ends = np.cumsum(lengths)
    cuts = []
    start = 0
    while start < len(lengths):
        before = int(ends[start - 1]) if start else 0
        end = max(start + 1, int(np.searchsorted(ends, before + max_tokens, side="right")))
        cuts.append((start, end))
        start = end
    chunk = tokenized.chunk
    carried = chunk.carried
    pieces = []
    for number, (a, b) in enumerate(cuts):
        first, last = number == 0, number == len(cuts) - 1
        part = chunk.rows(slice(a, b))
        part.last_in_unit = chunk.last_in_unit and last
        if first:
            part.bad, part.changed = chunk.bad, chunk.changed
        if carried is not None:
            part.carried, carried = (carried, None) if last else carried.before(chunk.positions[b])
        token_start = int(ends[a - 1]) if a else 0
        token_ids = tokenized.token_ids[token_start : int(ends[b - 1])]
        read = None if tokenized.read is None else tokenized.read[a:b]
        piece = TokenizedChunk(
            part, token_ids, lengths[a:b], tokenized.truncated_rows[a:b], read=read
        )
        if tokenized.pixels is not None:
            images = np.cumsum(lengths > 0)
            first_image = int(images[a - 1]) if a else 0
            piece.pixels = tokenized.pixels[first_image : int(images[b - 1])]
        if first:
            piece.carried_tokens = tokenized.carried_tokens
            piece.carried_truncated = tokenized.carried_truncated
        pieces.append(piece)
    return pieces


def _carried_bytes(chunk: TokenizedChunk) -> int:
    carried = chunk.chunk.carried
    return 0 if carried is None else carried.nbytes


def _pixel_bytes(chunk: TokenizedChunk) -> int:
    return 0 if chunk.pixels is None else chunk.pixels.nbytes


def share_of_window(chunk: TokenizedChunk, budget: int) -> float:
    """What a chunk takes of a full window: its tokens over `WINDOW_BATCHES` budgets (or
    its decoded images over `PIXEL_WINDOW_BYTES`, where that is more), plus its
    carried-over vectors over `CARRIED_WINDOW_BYTES`."""
    tokens = int(chunk.lengths.sum()) / (WINDOW_BATCHES * budget)
    tokens = max(tokens, _pixel_bytes(chunk) / PIXEL_WINDOW_BYTES)
    return tokens + _carried_bytes(chunk) / CARRIED_WINDOW_BYTES


def windows(
    chunks: Iterator[TokenizedChunk], max_tokens: int, per_unit: bool = False
) -> Iterator[list[TokenizedChunk]]:
    """Consecutive chunks, gathered until they hold `max_tokens` to embed, or
    `CARRIED_WINDOW_BYTES` of vectors carried over from a previous output, or
    `PIXEL_WINDOW_BYTES` of decoded images; a larger chunk is cut. A window also closes
    where a unit ends once it holds half of either limit (`per_unit`: at every unit's
    end, once it holds `UNIT_WINDOW_DOCUMENTS`), and one that began inside a unit closes
    where that unit ends: so windows seldom straddle
    units, and a run of them from one unit's start to another's end (what a device
    process embeds and writes, see `bulkembed.engine.unit_pool`) stays about a unit long.
    Windows depend only on the chunks since the last unit end that closed one."""
    window: list[TokenizedChunk] = []
    tokens = carried = pixels = documents = 0
    inside = False  # whether this window began inside a unit
    for chunk in chunks:
        for piece in split_chunk(chunk, max_tokens):
            window.append(piece)
            tokens += int(piece.lengths.sum())
            carried += _carried_bytes(piece)
            pixels += _pixel_bytes(piece)
            documents += len(piece.lengths)
            ends = piece.chunk.last_in_unit
            full = 2 * max(tokens / max_tokens, pixels / PIXEL_WINDOW_BYTES) >= 1
            if (
                tokens >= max_tokens
                or carried >= CARRIED_WINDOW_BYTES
                or pixels >= PIXEL_WINDOW_BYTES
                or (ends and (inside or full or (per_unit and documents >= UNIT_WINDOW_DOCUMENTS)))
            ):
                yield window
                window, tokens, carried, pixels, documents = [], 0, 0, 0, 0
                inside = not ends
    if window:
        yield window


def padded_lengths(batches: list[Batch]) -> np.ndarray:
    """The length each document of `batches` was padded to (its batch's longest), in the
    order of the documents' positions."""
    if not batches:
        return np.empty(0, dtype=np.int64)
    padded = np.concatenate([b.padded_lengths() for b in batches])
    return padded[input_order(batches)]


@dataclass(frozen=True, slots=True)
class EmbeddedHead:
    """The first documents of a window, embedded before the window is packed (the sample
    of the `--dtype auto` check, in the dtype it kept): their vectors in input order, the
    token-budget batches they ran in (positions within the head), and the seconds the
    model took for them."""

    vectors: Embeddings
    batches: list[Batch]
    seconds: float

    def __len__(self) -> int:
        return sum(b.size for b in self.batches)


@dataclass(slots=True)
class PackedWindow:
    """A window's chunks packed into token-budget batches, and the batches' embeddings as
    they land; with `head`, the window's first documents, embedded already, are left out
    of the batches."""

    chunks: list[TokenizedChunk]
    batches: list[Batch]
    token_batches: list[TokenBatch]
    outputs: list[Embeddings] = field(default_factory=list)
    head: EmbeddedHead | None = None

    @property
    def complete(self) -> bool:
        return len(self.outputs) == len(self.batches)

    def embedded(self) -> tuple[Embeddings, np.ndarray]:
        """Embeddings of every document of the window and the length each was padded to,
        both in input order."""
        vectors, padded = [], []
        if self.head is not None:
            vectors.append(self.head.vectors)
            padded.append(padded_lengths(self.head.batches))
        if self.batches:
            vectors.append(Embeddings.concatenate(self.outputs).take(input_order(self.batches)))
            padded.append(padded_lengths(self.batches))
        if not vectors:
            return Embeddings(), np.empty(0, dtype=np.int64)
        return Embeddings.concatenate(vectors), np.concatenate(padded)

    def embedded_so_far(self) -> tuple[np.ndarray, Embeddings]:
        """Which of the window's documents (positions among them, in order) are embedded
        (the head, and the batches whose outputs landed), and their vectors in that order."""
        skip = 0 if self.head is None else len(self.head)
        done = self.batches[: len(self.outputs)]
        rows = np.concatenate([np.arange(skip)] + [b.indices + skip for b in done])
        parts = [] if self.head is None else [self.head.vectors]
        vectors = Embeddings.concatenate(parts + self.outputs)
        if not len(rows):
            return rows.astype(np.int64), vectors
        order = np.argsort(rows, kind="stable")
        return rows[order].astype(np.int64), vectors.take(order)


def pack_window(
    window: list[TokenizedChunk],
    budget: int,
    head: EmbeddedHead | None = None,
    padded: bool = True,
) -> PackedWindow:
    """The window's documents sorted by length and packed into batches (`pack_batches`,
    `padded` or not); those of `head`, the first ones, embedded already, left out."""
    skip = 0 if head is None else len(head)
    lengths = np.concatenate([c.lengths for c in window]) if window else np.empty(0, np.int32)
    if len(lengths) <= skip:
        return PackedWindow(window, [], [], head=head)
    token_ids = np.concatenate([c.token_ids for c in window])
    starts = (np.cumsum(lengths) - lengths)[skip:]
    images = _window_pixels(window, skip)
    lengths = lengths[skip:]
    batches = pack_batches(lengths, budget, padded=padded)
    token_batches = [
        TokenBatch.from_sequences(
            [token_ids[s : s + n] for s, n in zip(starts[b.indices], b.lengths, strict=True)],
            None if images is None else images[b.indices],
        )
        for b in batches
    ]
    return PackedWindow(window, batches, token_batches, head=head)


def _window_pixels(window: list[TokenizedChunk], skip: int) -> np.ndarray | None:
    """The decoded images of a window's documents from the `skip`th on, one per document
    (every document of an image window that reaches packing has its image)."""
    if window[0].pixels is None:
        return None
    return np.concatenate([c.pixels for c in window if c.pixels is not None])[skip:]


def embed_packed(
    windows: Iterator[list[TokenizedChunk]],
    encoder: Embedder,
    budget: int,
    stats: RunStats,
    reporter: Reporter,
    head: EmbeddedHead | None = None,
    stopping: Callable[[], bool] = lambda: False,
) -> Iterator[PackedWindow]:
    """Each window packed into batches of `budget` tokens and embedded, in order, as one
    stream of batches: the next window is gathered and packed while the last batches of
    this one run (see `Encoder.embed_stream`). `head` holds the
    first window's first documents, embedded already: they count into `stats` as the
    batches they ran in, and go into that window's output in their place.

    Once `stopping()` says so, no batch goes to the encoder after those in flight; the windows
    left incomplete come last, as they are (`PackedWindow.complete` false).

    Embedding begins (`RunStats.begin_embedding`) as the first window goes to the encoder."""
    pending: deque[PackedWindow] = deque()

    def batches() -> Iterator[tuple[tuple[PackedWindow, int], TokenBatch | None]]:
        ahead = head
        for window in windows:
            if stopping():
                return
            with stats.timed("pack"):
                packed = pack_window(window, budget, ahead, not encoder.unpadded)
            stats.begin_embedding()
            if ahead is not None:
                _count_head(stats, ahead)
                reporter.update(stats)
                ahead = None
            pending.append(packed)
            for number, batch in enumerate(packed.token_batches):
                if stopping():
                    return
                yield (packed, number), batch
            if not packed.token_batches:
                # Nothing to embed (bad records, rows carried over): a marker, so that the
                # window goes on in its place rather than waiting for the next batch.
                yield (packed, -1), None

    def finished(key: tuple[PackedWindow, int], seconds: float, host_seconds: float) -> None:
        packed, number = key
        stats.encode_seconds += seconds + host_seconds
        stats.stages["model"] += seconds
        stats.stages["post-process"] += host_seconds
        _count(stats, packed.batches[number])
        reporter.update(stats)

    for (packed, _), embeddings in encoder.embed_stream(batches(), finished):
        if embeddings is not None:
            packed.outputs.append(embeddings)
        while pending and pending[0].complete:
            yield pending.popleft()
    while pending:
        yield pending.popleft()


def _count_head(stats: RunStats, head: EmbeddedHead) -> None:
    # Its seconds went by in start-up: the model's busy seconds, not the device's time
    # after start-up (`RunStats.device_idle_fraction`).
    stats.stages["model"] += head.seconds
    for batch in head.batches:
        _count(stats, batch)


def _count(stats: RunStats, batch: Batch) -> None:
    stats.docs += batch.size
    stats.tokens += batch.tokens
    stats.padded_tokens += batch.padded_tokens
    stats.batches += 1

"""What of the tokenized records goes on to be embedded, in input order: the first record of
each id (later ones become bad records), up to `--limit` documents, and with
`--on-bad-record fail` nothing past a bad record. A text that the reader cut and whose
kept tokens cannot be shown to be the whole text's is a bad record too (`long_texts`).

These steps run after the tokenizer processes, on the arrays they return (the ids hashed
there), so that the run's own process does no work per record but for the few it sets
aside.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from bulkembed.batching.tokenize import NOT_CUT_EXACTLY, TokenizedChunk
from bulkembed.errors import InputError
from bulkembed.sources import BadRecord, Chunk, InputFile, SeenIds, format_of
from bulkembed.sources.long_texts import MARGIN
from bulkembed.sources.records import DUPLICATE_ID

NOT_CUT_EXACTLY_REASON = (
    "text too long to read whole, whose first tokens do not end {margin} characters "
    "before where it was cut: it is not embedded from a start that may differ"
).format(margin=f"{MARGIN:,}")


def set_aside(chunks: Iterable[TokenizedChunk], files: list[InputFile]) -> Iterator[TokenizedChunk]:
    """Make bad records of the records whose text could not be cut exactly, and of those
    that could not be read (an image that does not decode: `TokenizedChunk.reasons`)."""
    for tokenized in chunks:
        read, reasons = tokenized.read, tokenized.reasons or {}
        uncut = np.zeros(len(tokenized.lengths), bool)
        if read is not None:
            uncut = read == NOT_CUT_EXACTLY
        if uncut.any() or reasons:
            chunk = tokenized.chunk
            for index in range(len(uncut)):
                reason = NOT_CUT_EXACTLY_REASON if uncut[index] else reasons.get(index)
                if reason is not None:
                    chunk.bad.append(_bad(chunk, files, index, reason))
                    uncut[index] = True
            tokenized.keep(np.flatnonzero(~uncut))
        yield tokenized


def _bad(chunk: Chunk, files: list[InputFile], index: int, reason: str) -> BadRecord:
    """A bad record for the record at `index` of `chunk`, placed at its line or row."""
    file = files[chunk.file]
    bad = BadRecord(str(file.path), reason, chunk.ids[index].as_py())
    position = int(chunk.positions[index])
    if format_of(file).lines:
        bad.line = position + 1
    else:
        bad.row = position
    return bad


def drop_duplicate_ids(
    chunks: Iterable[TokenizedChunk], seen: SeenIds, files: list[InputFile]
) -> Iterator[TokenizedChunk]:
    """Keep the first record of each id (in input order); later ones become bad records."""
    for tokenized in chunks:
        chunk = tokenized.chunk
        assert chunk.id_hashes is not None, "ids are hashed where they are tokenized"
        first = seen.add_hashes(chunk.id_hashes)
        if not first.all():
            for index in np.flatnonzero(~first).tolist():
                chunk.bad.append(_bad(chunk, files, index, DUPLICATE_ID))
            tokenized.keep(np.flatnonzero(first))
        yield tokenized


def take(chunks: Iterable[TokenizedChunk], limit: int | None) -> Iterator[TokenizedChunk]:
    """Stop after `limit` documents (None: no limit); the unit cut short ends there, and
    bad records past the last document taken are not reported."""
    if limit is None:
        yield from chunks
        return
    remaining = limit
    if remaining <= 0:
        return
    for tokenized in chunks:
        chunk = tokenized.chunk
        if len(chunk) >= remaining:
            last = int(chunk.positions[remaining - 1]) if remaining else -1
            tokenized.keep(np.arange(remaining))
            chunk.bad = [b for b in chunk.bad if b.position is None or b.position < last]
            chunk.last_in_unit = True
            yield tokenized
            return
        remaining -= len(chunk)
        yield tokenized


def fail_on_bad_records(chunks: Iterable[TokenizedChunk]) -> Iterator[TokenizedChunk]:
    """`--on-bad-record fail`: the chunks, until one holds a bad record."""
    for tokenized in chunks:
        if tokenized.chunk.bad:
            bad = tokenized.chunk.bad[0]
            raise InputError(
                f"bad record at {bad.where()}: {bad.reason} "
                "(--on-bad-record skip sets such records aside and goes on)"
            )
        yield tokenized


def leave_id_hashes(chunks: Iterable[TokenizedChunk]) -> Iterator[TokenizedChunk]:
    """The chunks on their way to the devices without their ids' hashes, which only
    admission and carry-over read: 8 bytes a record less to send to a device process."""
    for tokenized in chunks:
        chunk = tokenized.chunk
        chunk.id_hashes = None
        if chunk.carried is not None:
            chunk.carried.records.id_hashes = None
        yield tokenized

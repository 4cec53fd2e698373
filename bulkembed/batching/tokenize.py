"""Tokenize chunks of texts on CPU worker processes.

Each worker rebuilds the fast tokenizer from its JSON once, then turns a chunk's texts into
flat arrays of token ids plus lengths (truncated, no padding), which pickle cheaply. It also
computes what is computed once per document: the content hash of each text (as the model
reads it) and the keyed hash of each id (`IdKey`), so that the run's own process does no work per
document but on arrays. The workers are a `bulkembed.workers.WorkerPool`: at most
`max_in_flight` chunks are queued, results come back in submission order, and a worker that
dies or is stuck on a chunk raises `WorkerError` instead of hanging the run (a chunk is
cheap to redo: the run is resumed).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa

from bulkembed.contracts import RowCounts, ragged_positions
from bulkembed.sources import Chunk, IdKey
from bulkembed.sources.long_texts import MARGIN, tokenizer_bound
from bulkembed.workers import WorkerPool

if TYPE_CHECKING:
    from bulkembed.batching.decode import ImageSettings


class KnownTexts(Protocol):
    """What a tokenizer asks of a previous output (`bulkembed.incremental.lookup.PreviousLookup` is
    one): which documents, by their id keys and text digests, need no tokenizing."""

    def counted(self, keys: np.ndarray, hashes: np.ndarray) -> np.ndarray: ...


# A chunk takes milliseconds to tokenize; a worker this late is stuck, not slow.
RESULT_TIMEOUT_SECONDS = 600
# Starting a worker takes a second or two: building the tokenizer from its JSON.
START_TIMEOUT_SECONDS = 120


@dataclass(frozen=True, slots=True)
class TokenizerSettings:
    """What a worker needs to reproduce the model's tokenization exactly."""

    tokenizer_json: str
    max_length: int
    prompt: str = ""
    lowercase: bool = False
    marker_id: int | None = None
    # What its worker processes are called in errors.
    stage = "tokenizer"

    def model_text(self, text: str) -> str:
        """The text as the model reads it: prompt first, lowercased if the model wants."""
        text = self.prompt + text
        return text.lower() if self.lowercase else text

    def preparer(self, previous: KnownTexts | None, id_key: IdKey | None) -> TextTokenizer:
        """What a worker process runs on each chunk (`Preparer`)."""
        return TextTokenizer(self, previous, id_key)


class Preparer(Protocol):
    """What a worker process does to a chunk's contents: `TextTokenizer` tokenizes texts,
    `bulkembed.batching.decode.ImagePreparer` decodes images."""

    def timed(self, inputs_of_chunk: tuple[pa.Array, pa.Array, np.ndarray]) -> Prepared: ...


@dataclass(slots=True)
class TokenizedChunk:
    """A chunk's token ids, flat, with one length per record and whether it was truncated
    (texts themselves are dropped), the seconds its tokenizer took, and the tokens and
    truncated texts of its records carried over from a previous output (counted, not
    kept: they left the chunk). `untokenized` marks the records whose text the previous
    output holds unchanged, with their counts: they were not tokenized (length 0 here),
    since they are carried over. `read` says how each text was read (`WHOLE`, `CUT`,
    `NOT_CUT_EXACTLY`: see `long_texts`; None: every one whole). An image record is
    `tokens` long (the tokens it is to the model: `ImageProcessing.tokens`) and its token
    ids are 0; `pixels` holds the decoded image of each record whose length is not 0, in
    order, uint8 [images, height, width, 3]. `reasons` says why each record that could
    not be read (an image that does not decode) cannot be embedded, by its index: it is
    set aside (`admission.set_aside`)."""

    chunk: Chunk
    token_ids: np.ndarray
    lengths: np.ndarray
    truncated_rows: np.ndarray
    seconds: float = 0.0
    carried_tokens: int = 0
    carried_truncated: int = 0
    untokenized: np.ndarray | None = None
    read: np.ndarray | None = None
    pixels: np.ndarray | None = None
    reasons: dict[int, str] | None = None

    @property
    def truncated(self) -> int:
        """How many of the records were truncated at the max length."""
        return int(self.truncated_rows.sum())

    @property
    def cut(self) -> int:
        """How many of the records' texts were cut before they were tokenized."""
        return 0 if self.read is None else int((self.read == CUT).sum())

    def keep(self, rows: np.ndarray) -> None:
        """Keep only the records at `rows` (indices, in order), their tokens with them."""
        starts = np.cumsum(self.lengths, dtype=np.int64) - self.lengths
        lengths = self.lengths[rows]
        self.token_ids = self.token_ids[ragged_positions(starts[rows], lengths)]
        if self.pixels is not None:
            images = np.cumsum(self.lengths > 0) - 1
            self.pixels = self.pixels[images[rows][lengths > 0]]
        if self.reasons is not None:
            kept = {int(old): new for new, old in enumerate(np.asarray(rows).tolist())}
            self.reasons = {kept[i]: why for i, why in self.reasons.items() if i in kept} or None
        self.lengths, self.truncated_rows = lengths, self.truncated_rows[rows]
        if self.untokenized is not None:
            self.untokenized = self.untokenized[rows]
        if self.read is not None:
            self.read = self.read[rows]
        self.chunk.keep(rows)

    def counts(self, rows: np.ndarray, looked_up: RowCounts) -> RowCounts:
        """The counts of the records at `rows`: their own where they were tokenized, else
        `looked_up` (the previous output's, for the same records)."""
        mine = RowCounts(self.lengths[rows], self.truncated_rows[rows])
        if self.untokenized is None:
            return mine
        skipped = self.untokenized[rows]
        return RowCounts(
            np.where(skipped, looked_up.tokens, mine.tokens).astype(np.int32),
            np.where(skipped, looked_up.truncated, mine.truncated),
        )

    def count_as_carried(self, rows: np.ndarray, counts: RowCounts) -> None:
        """The records at `rows` were carried over: count their tokens and truncated texts
        (`counts`) as carried ones, and drop them (their vectors come from the previous
        output)."""
        self.carried_tokens += int(counts.tokens.sum())
        self.carried_truncated += int(counts.truncated.sum())
        others = np.ones(len(self.lengths), dtype=bool)
        others[rows] = False
        self.keep(np.flatnonzero(others))


@dataclass(slots=True)
class Prepared:
    """What a worker returns for a chunk (`TokenizedChunk` says what each is), with the
    content hashes (16-byte digests) and the ids' hashes ([ids, 2])."""

    token_ids: np.ndarray
    lengths: np.ndarray
    truncated: np.ndarray
    seconds: float
    digests: np.ndarray
    id_hashes: np.ndarray
    skipped: np.ndarray | None
    read: np.ndarray
    pixels: np.ndarray | None = None
    reasons: dict[int, str] | None = None


# How a text was read: whole; cut before tokenizing, its kept tokens the whole text's
# (`long_texts`); cut by the reader, and not provably so: it is set aside.
WHOLE, CUT, NOT_CUT_EXACTLY = 0, 1, 2


class TextTokenizer:
    """The model's fast tokenizer with truncation on and padding off. `timed`, for a run's
    chunks, also hashes their ids with the run's `id_key`; with `previous`, the lookup of a
    previous output (`bulkembed.incremental.lookup`), it leaves alone the texts that output holds
    unchanged with their counts."""

    def __init__(
        self,
        settings: TokenizerSettings,
        previous: KnownTexts | None = None,
        id_key: IdKey | None = None,
    ) -> None:
        from tokenizers import Tokenizer

        self.settings = settings
        self.previous = previous
        self.id_key = id_key
        self.tokenizer = Tokenizer.from_str(settings.tokenizer_json)
        self.tokenizer.no_padding()
        # A ColBERT document marker goes in after the first token and counts toward the limit.
        room = settings.max_length - (settings.marker_id is not None)
        self.tokenizer.enable_truncation(room)

    def __call__(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Flat token ids, their lengths per text, and whether each text was truncated."""
        inputs = [self.settings.model_text(t) for t in texts]
        flat, lengths, truncated, _ = self._encoded(inputs)
        return flat, lengths, truncated

    def _encoded(
        self, inputs: list[str], cut_before: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Flat token ids, their lengths, whether each text was truncated and how it was
        read (`WHOLE`, `CUT`, `NOT_CUT_EXACTLY`); `cut_before` marks the texts the reader
        cut (`long_texts`)."""
        bound = tokenizer_bound(self.settings.max_length) + len(self.settings.prompt)
        long = [i for i, text in enumerate(inputs) if len(text) > bound]
        batch = [text if len(text) <= bound else "" for text in inputs] if long else inputs
        encodings = self.tokenizer.encode_batch(batch, add_special_tokens=True)
        read = np.zeros(len(inputs), np.int8)
        for i in long:
            whole = cut_before is None or not cut_before[i]
            encodings[i], read[i] = self._long_encoding(inputs[i], bound, whole)
        marker = self.settings.marker_id
        sequences = [
            e.ids if marker is None else [*e.ids[:1], marker, *e.ids[1:]] for e in encodings
        ]
        lengths = np.fromiter((len(s) for s in sequences), dtype=np.int32, count=len(inputs))
        flat = np.fromiter(
            (i for s in sequences for i in s), dtype=np.int32, count=int(lengths.sum())
        )
        truncated = np.fromiter((bool(e.overflowing) for e in encodings), bool, len(inputs))
        return flat, lengths, truncated, read

    def _long_encoding(self, text: str, bound: int, whole: bool) -> tuple[Any, int]:
        """The encoding of a text longer than `bound`, and how it was read: from its first
        `bound` characters, 4 times as many, and so on, once the kept tokens end `MARGIN`
        characters before the cut (`long_texts`); else from all of it, which is the whole
        text unless the reader cut it (`whole`)."""
        size = bound
        while size < len(text):
            encoding = self.tokenizer.encode(text[:size], add_special_tokens=True)
            if _kept_before(encoding, size - MARGIN):
                return encoding, CUT
            size *= 4
        encoding = self.tokenizer.encode(text, add_special_tokens=True)
        if whole:
            return encoding, WHOLE
        return encoding, CUT if _kept_before(encoding, len(text) - MARGIN) else NOT_CUT_EXACTLY

    def timed(self, inputs_of_chunk: tuple[pa.Array, pa.Array, np.ndarray]) -> Prepared:
        """For a chunk's texts, ids and the content hashes the reader took (of the texts
        it cut; zero for the others): their tokens, the seconds the tokenizer took, and
        the hashes of the texts (as the model reads them) and of the ids."""
        texts, ids, known = inputs_of_chunk
        assert self.id_key is not None, "a run's tokenizer hashes ids with the run's key"
        inputs = [self.settings.model_text(t) for t in texts.to_pylist()]
        digests = np.array([content_digest(t) for t in inputs], dtype="S16")
        cut_before = None
        if len(known):
            cut_before = known != b""
            digests[cut_before] = known[cut_before]
        keys = self.id_key.hashes(ids)
        skipped = None if self.previous is None else self.previous.counted(keys, digests)
        started = time.perf_counter()
        if skipped is None or not skipped.any():
            flat, lengths, truncated, read = self._encoded(inputs, cut_before)
        else:
            others = np.flatnonzero(~skipped)
            some_cut = None if cut_before is None else cut_before[others]
            flat, some, some_truncated, some_read = self._encoded(
                [inputs[i] for i in others], some_cut
            )
            lengths = np.zeros(len(inputs), np.int32)
            lengths[others] = some
            truncated = np.zeros(len(inputs), bool)
            truncated[others] = some_truncated
            read = np.zeros(len(inputs), np.int8)
            read[others] = some_read
        seconds = time.perf_counter() - started
        return Prepared(flat, lengths, truncated, seconds, digests, keys, skipped, read)


def _kept_before(encoding: Any, end: int) -> bool:
    """Whether `encoding` was truncated and the last token it kept (but special ones) ends
    by character `end` of its text."""
    if not encoding.overflowing:
        return False
    offsets, specials = encoding.offsets, encoding.special_tokens_mask
    ends = [e for (_, e), special in zip(offsets, specials, strict=True) if not special]
    return bool(ends) and ends[-1] <= end


def content_digest(text: str) -> bytes:
    """BLAKE2b-128 of the text's UTF-8 bytes: a document's content hash."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()


def tokenizer_threads(workers: int) -> int:
    """Threads for each tokenizer process: the cores shared out among the processes, so
    that one process per core runs single-threaded and none oversubscribes the machine.

    >>> import os; tokenizer_threads(os.cpu_count()), tokenizer_threads(1) == os.cpu_count()
    (1, True)
    """
    return max(1, (os.cpu_count() or 1) // max(1, workers))


def _start_tokenizer(
    setting: tuple[TokenizerSettings | ImageSettings, int, KnownTexts | None, IdKey],
) -> tuple[Callable[[tuple[pa.Array, pa.Array, np.ndarray]], Prepared], None]:
    """A worker's preparer (`bulkembed.workers`): a tokenizer rebuilt once, from its JSON,
    with its batch encoding spread over `threads` (the tokenizers library's thread pool
    reads this variable when it first starts, in this new process), or an image decoder."""
    settings, threads, previous, id_key = setting
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    return settings.preparer(previous, id_key).timed, None


def _texts(chunk: Chunk) -> tuple[pa.Array, pa.Array, np.ndarray]:
    """What a worker reads of a chunk: its texts and ids, and the content hashes the reader
    took of the texts it cut (`long_texts`)."""
    return chunk.texts, chunk.ids, chunk.hashes


def _tokenized(chunk: Chunk, result: Prepared) -> TokenizedChunk:
    """The chunk with its tokens and hashes; its texts are dropped, since a window must not
    hold megabytes of them once they are tokenized."""
    chunk.hashes, chunk.id_hashes = result.digests, result.id_hashes
    # A new empty array: a slice of the texts would still pickle their whole buffer.
    chunk.texts = pa.nulls(0, chunk.texts.type)
    return TokenizedChunk(
        chunk,
        result.token_ids,
        result.lengths,
        result.truncated,
        result.seconds,
        untokenized=result.skipped,
        read=result.read,
        pixels=result.pixels,
        reasons=result.reasons,
    )


class TokenizerPool:
    """Tokenize chunks on `workers` processes (0: in this process), in order, bounded, their
    ids hashed with the run's `id_key`; with `previous` (a previous output's lookup), texts
    it holds unchanged are left untokenized (`TextTokenizer`). Image settings make it
    decode images instead (`ImagePreparer`). The processes start without the pool waiting
    for them (the first chunk does): the run loads its model meanwhile."""

    def __init__(
        self,
        settings: TokenizerSettings | ImageSettings,
        workers: int,
        id_key: IdKey,
        max_in_flight: int = 0,
        previous: KnownTexts | None = None,
    ) -> None:
        self.max_in_flight = max_in_flight or max(2, 4 * workers)
        # Whether `map` was left with results it did not read.
        self._unread = False
        self._local: Preparer | None = None
        self._pool: WorkerPool[tuple[pa.Array, pa.Array, np.ndarray], Prepared] | None = None
        if workers == 0:
            self._local = settings.preparer(previous, id_key)
        else:
            self._pool = WorkerPool(
                _start_tokenizer,
                [(settings, tokenizer_threads(workers), previous, id_key)] * workers,
                settings.stage,
                [f"process {n}" for n in range(workers)],
                START_TIMEOUT_SECONDS,
                RESULT_TIMEOUT_SECONDS,
                task="chunk",
                wait=False,
            )

    def map(self, chunks: Iterable[Chunk]) -> Iterator[TokenizedChunk]:
        """Tokenized chunks in the order of `chunks`, keeping at most `max_in_flight` queued."""
        if self._local is not None:
            for chunk in chunks:
                yield _tokenized(chunk, self._local.timed(_texts(chunk)))
            return
        assert self._pool is not None
        texts = ((chunk, _texts(chunk)) for chunk in chunks)
        self._unread = True
        for chunk, result in self._pool.map(texts, self.max_in_flight):
            yield _tokenized(chunk, result)
        self._unread = False

    def close(self, failed: bool = False) -> None:
        """Stop the workers; after a failure they are killed rather than waited for, since
        one of them may be stuck. So are they when their results were left unread (`--limit`
        reached): a worker would wait to hand over a result that no one takes."""
        if self._pool is not None:
            self._pool.close(failed or self._unread)
            self._pool = None

    def __enter__(self) -> TokenizerPool:
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        self.close(failed=kind is not None)

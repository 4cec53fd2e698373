"""Tokenize chunks of texts on CPU worker processes.

Each worker rebuilds the fast tokenizer from its JSON once, then turns lists of texts into
flat arrays of token ids plus lengths (truncated, no padding), which pickle cheaply. The
workers are a `bulkembed.workers.WorkerPool`: at most `max_in_flight` chunks are queued,
results come back in submission order, and a worker that dies or is stuck on a chunk raises
`WorkerError` instead of hanging the run (a chunk is cheap to redo: the run is resumed).

The texts of records carried over from a previous output (`--since`) are tokenized too, but
only counted: the summary's tokens and truncated documents cover the whole output, exactly.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from bulkembed.sources import Chunk
from bulkembed.workers import WorkerPool

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

    def model_text(self, text: str) -> str:
        """The text as the model reads it: prompt first, lowercased if the model wants."""
        text = self.prompt + text
        return text.lower() if self.lowercase else text


@dataclass(slots=True)
class TokenizedChunk:
    """A chunk's token ids, flat, with one length per text (texts themselves are dropped),
    the seconds its tokenizer took, and the tokens and truncated texts of its carried-over
    records (counted, not kept)."""

    chunk: Chunk
    token_ids: np.ndarray
    lengths: np.ndarray
    truncated: int
    seconds: float = 0.0
    carried_tokens: int = 0
    carried_truncated: int = 0


# What a worker returns for a chunk: token ids, lengths, truncated texts, seconds, and the
# tokens and truncated texts of its carried-over records.
Tokens = tuple[np.ndarray, np.ndarray, int, float, int, int]


class TextTokenizer:
    """The model's fast tokenizer with truncation on and padding off."""

    def __init__(self, settings: TokenizerSettings) -> None:
        from tokenizers import Tokenizer

        self.settings = settings
        self.tokenizer = Tokenizer.from_str(settings.tokenizer_json)
        self.tokenizer.no_padding()
        # A ColBERT document marker goes in after the first token and counts toward the limit.
        room = settings.max_length - (settings.marker_id is not None)
        self.tokenizer.enable_truncation(room)

    def __call__(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, int]:
        """Flat token ids, their lengths per text, and how many texts were truncated."""
        inputs = [self.settings.model_text(t) for t in texts]
        encodings = self.tokenizer.encode_batch(inputs, add_special_tokens=True)
        marker = self.settings.marker_id
        sequences = [
            e.ids if marker is None else [*e.ids[:1], marker, *e.ids[1:]] for e in encodings
        ]
        lengths = np.fromiter((len(s) for s in sequences), dtype=np.int32, count=len(inputs))
        flat = np.fromiter(
            (i for s in sequences for i in s), dtype=np.int32, count=int(lengths.sum())
        )
        truncated = sum(1 for e in encodings if e.overflowing)
        return flat, lengths, truncated

    def timed(self, texts: tuple[list[str], list[str]]) -> Tokens:
        """For a chunk's texts and its carried-over texts: what calling it on the first
        returns, the seconds it took, and the tokens and truncated texts of the second."""
        started = time.perf_counter()
        flat, lengths, truncated = self(texts[0])
        seconds = time.perf_counter() - started
        _, carried, carried_truncated = self(texts[1]) if texts[1] else (None, lengths[:0], 0)
        return flat, lengths, truncated, seconds, int(carried.sum()), carried_truncated


def tokenizer_threads(workers: int) -> int:
    """Threads for each tokenizer process: the cores shared out among the processes, so
    that one process per core runs single-threaded and none oversubscribes the machine.

    >>> import os; tokenizer_threads(os.cpu_count()), tokenizer_threads(1) == os.cpu_count()
    (1, True)
    """
    return max(1, (os.cpu_count() or 1) // max(1, workers))


def _start_tokenizer(
    setting: tuple[TokenizerSettings, int],
) -> tuple[Callable[[tuple[list[str], list[str]]], Tokens], None]:
    """A worker's tokenizer (`bulkembed.workers`): rebuilt once, from its JSON, and timed,
    with its batch encoding spread over `threads` (the tokenizers library's thread pool
    reads this variable when it first starts, in this new process)."""
    settings, threads = setting
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    return TextTokenizer(settings).timed, None


def _texts(chunk: Chunk) -> tuple[list[str], list[str]]:
    """What a worker tokenizes of a chunk: its texts, and its carried-over ones."""
    return chunk.texts, [] if chunk.carried is None else chunk.carried.records.texts


def _tokenized(chunk: Chunk, result: Tokens) -> TokenizedChunk:
    """The chunk with its tokens; its texts are dropped, since a window must not hold
    megabytes of them once they are tokenized."""
    tokenized = TokenizedChunk(chunk, *result)
    chunk.texts = []
    if chunk.carried is not None:
        chunk.carried.records.texts = []
    return tokenized


class TokenizerPool:
    """Tokenize chunks on `workers` processes (0: in this process), in order, bounded."""

    def __init__(self, settings: TokenizerSettings, workers: int, max_in_flight: int = 0) -> None:
        self.max_in_flight = max_in_flight or max(2, 4 * workers)
        self._local: TextTokenizer | None = None
        self._pool: WorkerPool[tuple[list[str], list[str]], Tokens] | None = None
        if workers == 0:
            self._local = TextTokenizer(settings)
        else:
            self._pool = WorkerPool(
                _start_tokenizer,
                [(settings, tokenizer_threads(workers))] * workers,
                "tokenizer",
                [f"process {n}" for n in range(workers)],
                START_TIMEOUT_SECONDS,
                RESULT_TIMEOUT_SECONDS,
                task="chunk",
            )

    def map(self, chunks: Iterable[Chunk]) -> Iterator[TokenizedChunk]:
        """Tokenized chunks in the order of `chunks`, keeping at most `max_in_flight` queued."""
        if self._local is not None:
            for chunk in chunks:
                yield _tokenized(chunk, self._local.timed(_texts(chunk)))
            return
        assert self._pool is not None
        texts = ((chunk, _texts(chunk)) for chunk in chunks)
        for chunk, result in self._pool.map(texts, self.max_in_flight):
            yield _tokenized(chunk, result)

    def close(self, failed: bool = False) -> None:
        """Stop the workers; after a failure they are killed rather than waited for, since
        one of them may be stuck."""
        if self._pool is not None:
            self._pool.close(failed)
            self._pool = None

    def __enter__(self) -> TokenizerPool:
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        self.close(failed=kind is not None)

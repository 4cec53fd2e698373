"""Tokenize chunks of texts on CPU worker processes.

Each worker rebuilds the fast tokenizer from its JSON once, then turns lists of texts into
flat arrays of token ids plus lengths (truncated, no padding), which pickle cheaply. At most
`max_in_flight` chunks are queued; results come back in submission order; a worker that dies
raises `WorkerError` instead of hanging the run.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import TimeoutError as ResultTimeout
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

import numpy as np

from bulkembed.errors import WorkerError
from bulkembed.sources import Chunk

# A chunk takes milliseconds to tokenize; a worker this late is stuck, not slow.
RESULT_TIMEOUT_SECONDS = 600
PARENT_CHECK_SECONDS = 0.5


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
    """A chunk's token ids, flat, with one length per text (texts themselves are dropped)."""

    chunk: Chunk
    token_ids: np.ndarray
    lengths: np.ndarray
    truncated: int


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


_worker_tokenizer: TextTokenizer | None = None


def exit_with_parent(parent: int) -> None:
    """End this worker once its parent is gone. A parent killed outright (SIGKILL, OOM
    killer) cannot shut its pool down, and a worker would otherwise wait forever for work."""
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK_SECONDS)
    os._exit(0)


def _init_worker(settings: TokenizerSettings, parent: int) -> None:
    global _worker_tokenizer
    # Ctrl-C and SIGTERM reach the whole process group: the main process decides how to
    # stop, and shuts the workers down itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    threading.Thread(target=exit_with_parent, args=(parent,), daemon=True).start()
    _worker_tokenizer = TextTokenizer(settings)


def _tokenize_in_worker(texts: list[str]) -> tuple[np.ndarray, np.ndarray, int]:
    assert _worker_tokenizer is not None, "worker initializer did not run"
    return _worker_tokenizer(texts)


def _drop_texts(tokenized: TokenizedChunk) -> TokenizedChunk:
    """Texts are not needed once tokenized; a window must not hold megabytes of them."""
    tokenized.chunk.texts = []
    return tokenized


class TokenizerPool:
    """Tokenize chunks on `workers` processes (0: in this process), in order, bounded."""

    def __init__(self, settings: TokenizerSettings, workers: int, max_in_flight: int = 0) -> None:
        self.workers = workers
        self.max_in_flight = max_in_flight or max(2, 4 * workers)
        self._local: TextTokenizer | None = None
        self._executor: ProcessPoolExecutor | None = None
        if workers == 0:
            self._local = TextTokenizer(settings)
        else:
            self._executor = ProcessPoolExecutor(
                max_workers=workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_init_worker,
                initargs=(settings, os.getpid()),
            )

    def map(self, chunks: Iterable[Chunk]) -> Iterator[TokenizedChunk]:
        """Tokenized chunks in the order of `chunks`, keeping at most `max_in_flight` queued."""
        if self._local is not None:
            for chunk in chunks:
                yield _drop_texts(TokenizedChunk(chunk, *self._local(chunk.texts)))
            return
        assert self._executor is not None
        in_flight: deque[tuple[Chunk, Future]] = deque()
        for chunk in chunks:
            in_flight.append((chunk, self._submit(chunk)))
            if len(in_flight) >= self.max_in_flight:
                yield self._result(*in_flight.popleft())
        while in_flight:
            yield self._result(*in_flight.popleft())

    def _submit(self, chunk: Chunk) -> Future:
        assert self._executor is not None
        try:
            return self._executor.submit(_tokenize_in_worker, chunk.texts)
        except BrokenProcessPool as e:
            raise self._died() from e

    def _result(self, chunk: Chunk, future: Future) -> TokenizedChunk:
        try:
            return _drop_texts(TokenizedChunk(chunk, *future.result(RESULT_TIMEOUT_SECONDS)))
        except BrokenProcessPool as e:
            raise self._died() from e
        except ResultTimeout as e:
            raise WorkerError(
                f"a tokenizer worker gave no result in {RESULT_TIMEOUT_SECONDS} s; "
                "committed output is kept: run the same command again to resume"
            ) from e

    def _died(self) -> WorkerError:
        return WorkerError(
            "a tokenizer worker process died (killed, or out of memory?); committed output "
            "is kept: run the same command again to resume"
        )

    def close(self, failed: bool = False) -> None:
        """Stop the workers; queued work is cancelled. After a failure the workers are
        killed rather than waited for, since one of them may be stuck."""
        if self._executor is None:
            return
        if failed:
            processes = list(getattr(self._executor, "_processes", {}).values())
            self._executor.shutdown(wait=False, cancel_futures=True)
            for process in processes:
                process.kill()
        else:
            self._executor.shutdown(wait=True, cancel_futures=True)
        self._executor = None

    def __enter__(self) -> TokenizerPool:
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        self.close(failed=kind is not None)

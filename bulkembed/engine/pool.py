"""Encoders on worker processes, one per device, fed from one shared queue of batches.

Each worker loads the model on its device and takes the next batch from the shared queue as
soon as it is free, so a slower device simply takes fewer batches (no static split). Results
are put back in submission order. A worker that fails or dies ends the run with an error,
never a hang; workers exit when the run's process is gone.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from bulkembed.encoders import Embeddings, TokenBatch
from bulkembed.errors import BulkembedError, WorkerError
from bulkembed.tokenize import exit_with_parent

if TYPE_CHECKING:
    from bulkembed.model_spec import ModelSpec

# Batches queued per worker: enough that a worker never waits for the next one.
BATCHES_PER_WORKER = 2
POLL_SECONDS = 1.0
START_TIMEOUT_SECONDS = 1800


def _serve(
    spec: ModelSpec,
    device: str,
    dtype_name: str,
    threads: int,
    tune: bool,
    tasks: Any,
    results: Any,
    parent: int,
) -> None:
    """A worker: load the encoder (and probe its token budget if `tune`), then embed
    batches until told to stop (None)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    threading.Thread(target=exit_with_parent, args=(parent,), daemon=True).start()
    import torch

    from bulkembed.engine.session import start_encoder

    try:
        encoder, budget = start_encoder(spec, device, getattr(torch, dtype_name), threads, tune)
    except Exception as e:  # reported to the parent, which raises it there
        results.put(("failed", device, f"{type(e).__name__}: {e}"))
        return
    results.put(("ready", device, (encoder.dense_dim, encoder.multivector_dim, budget)))
    while (task := tasks.get()) is not None:
        number, batch = task
        started = time.perf_counter()
        try:
            embeddings = encoder.embed_within_memory(batch)
        except Exception as e:
            results.put(("failed", device, f"{type(e).__name__}: {e}"))
            return
        results.put(("done", number, (embeddings, time.perf_counter() - started)))


class EncoderPool:
    """One encoder process per device; `embed_batches` spreads batches over them. With
    `tune`, each worker probes its device's token budget (`Encoder.tune_batch_tokens`) and
    `batch_tokens` is the smallest, so that every batch fits every device."""

    def __init__(
        self, spec: ModelSpec, devices: list[str], dtype_name: str, threads: int, tune: bool
    ) -> None:
        context = multiprocessing.get_context("spawn")
        self.devices = devices
        self._tasks = context.Queue()
        self._results = context.Queue()
        self._workers = [
            context.Process(
                target=_serve,
                args=(spec, d, dtype_name, threads, tune, self._tasks, self._results, os.getpid()),
                name=f"bulkembed-encoder-{d}",
                daemon=True,
            )
            for d in devices
        ]
        for worker in self._workers:
            worker.start()
        ready = [self._next("ready", START_TIMEOUT_SECONDS)[2] for _ in self._workers]
        dims = {(dense, multivector) for dense, multivector, _ in ready}
        if len(dims) != 1:
            raise WorkerError(f"the encoders on {', '.join(devices)} disagree on vector sizes")
        self.dense_dim, self.multivector_dim = dims.pop()
        budgets = [budget for _, _, budget in ready if budget is not None]
        self.batch_tokens = min(budgets) if budgets else None

    def _next(self, kind: str, timeout: float) -> tuple[str, Any, Any]:
        """The next message from the workers, of `kind`; a failure or a death raises."""
        waited = 0.0
        while True:
            try:
                message = self._results.get(timeout=POLL_SECONDS)
            except queue.Empty:
                waited += POLL_SECONDS
                dead = [w.name for w in self._workers if not w.is_alive()]
                if dead or waited >= timeout:
                    what = f"{', '.join(dead)} died" if dead else f"no answer in {timeout:.0f} s"
                    raise WorkerError(f"encoder worker {what}; see the log above") from None
                continue
            if message[0] == "failed":
                raise BulkembedError(f"the encoder on {message[1]} failed: {message[2]}")
            assert message[0] == kind, message
            return message

    def embed_batches(
        self, batches: list[TokenBatch], finished: Callable[[int, float], None]
    ) -> list[Embeddings]:
        """Embeddings of each batch, in order; `finished(i, seconds)` as each one comes
        back, with its device time shared out over the devices (they run side by side)."""
        found: dict[int, Embeddings] = {}
        submitted = 0
        limit = BATCHES_PER_WORKER * len(self._workers)
        while len(found) < len(batches):
            while submitted < len(batches) and submitted - len(found) < limit:
                self._tasks.put((submitted, batches[submitted]))
                submitted += 1
            _, number, (embeddings, seconds) = self._next("done", START_TIMEOUT_SECONDS)
            found[number] = embeddings
            finished(number, seconds / len(self._workers))
        return [found[i] for i in range(len(batches))]

    def close(self) -> None:
        """Stop the workers: politely, then for good."""
        for worker in self._workers:
            if worker.is_alive():
                self._tasks.put(None)
        for worker in self._workers:
            worker.join(timeout=10)
            if worker.is_alive():
                worker.kill()
                worker.join()

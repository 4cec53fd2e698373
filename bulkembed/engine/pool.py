"""Encoders on worker processes, one per device, each batch sent to the least busy one.

Each worker starts the model on its device as every encoder starts (`start_encoder`); the
run hands each batch to the worker that holds the fewest, so a slower device simply gets
fewer batches (no static split). Results come back in submission order. The workers are a
`bulkembed.workers.WorkerPool`: one that dies (killed, out of memory) has its batches in
flight embedded again by the others, with a warning, so the output is the same; one that
fails, a batch that kills a second worker, or no worker left ends the run with an error,
and so does a batch that takes more than `batch_timeout()` (a hung device), never a hang.
The workers exit when the run's process is gone.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeVar

from bulkembed.contracts import DeviceCounts, Embeddings, TokenBatch
from bulkembed.errors import UsageError, WorkerError
from bulkembed.workers import WorkerPool

if TYPE_CHECKING:
    from bulkembed.encoders import Encoder
    from bulkembed.models.model_spec import ModelSpec

Key = TypeVar("Key")
Task = TypeVar("Task")
Setting = TypeVar("Setting", bound="_OnDevice")


class Ready(NamedTuple):
    """What a device process tells as it starts: its vector sizes, token budget (None: not
    probed), whether its batches run unpadded and the kernel that attends in them, and the
    warnings and remarks of its model's load for the run's log."""

    dense: int | None
    multivector: int | None
    budget: int | None
    unpadded: bool
    kernel: str | None = None
    notices: tuple[str, ...] = ()
    remarks: tuple[str, ...] = ()

    @classmethod
    def of(cls, embedder: Encoder, budget: int | None) -> Ready:
        """What `embedder` tells, with `budget`."""
        return cls(
            embedder.dense_dim,
            embedder.multivector_dim,
            budget,
            embedder.unpadded,
            embedder.attention_kernel,
            tuple(embedder.notices),
            tuple(embedder.remarks),
        )


class _OnDevice(Protocol):
    """A device process's setting: it names its device."""

    @property
    def device(self) -> str: ...


# Batches queued per worker: enough that a worker never waits for the next one.
BATCHES_PER_WORKER = 2
# Loading a large model from a network disk and probing its budget can take minutes.
START_TIMEOUT_SECONDS = 1800
# A batch takes seconds even on a CPU; a device this late is hung, not slow.
BATCH_TIMEOUT_SECONDS = 600
BATCH_TIMEOUT_VARIABLE = "BULKEMBED_BATCH_TIMEOUT"


def batch_timeout() -> float:
    """The seconds one batch may take: `BULKEMBED_BATCH_TIMEOUT` where it is set, else
    `BATCH_TIMEOUT_SECONDS`."""
    value = os.environ.get(BATCH_TIMEOUT_VARIABLE)
    if value is None:
        return BATCH_TIMEOUT_SECONDS
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < float("inf"):
        raise UsageError(f"{BATCH_TIMEOUT_VARIABLE} must be seconds above 0, not {value!r}")
    return seconds


def start_device_workers(
    start: Callable[[Setting], tuple[Callable[[Task], Any], Ready]],
    settings: list[Setting],
    task: str,
    warn: Callable[[str], None] | None,
) -> tuple[WorkerPool[Task, Any], Ready]:
    """One encoder process per device (`settings[i].device`), each started by `start`,
    which tells its vector sizes, token budget and batch layout; a process that dies has its
    `task`s run again by the others, and one that finishes no batch in `batch_timeout()`
    fails the run. Returns the pool and what the processes told: the vector sizes and
    batch layout (the same on every device, or an error), the smallest budget found, and
    every warning and remark once."""
    devices = [setting.device for setting in settings]
    pool: WorkerPool[Task, Any] = WorkerPool(
        start,
        settings,
        "encoder",
        devices,
        START_TIMEOUT_SECONDS,
        batch_timeout(),
        task=task,
        step="batch",
        requeue=True,
        warn=warn,
    )
    ready: list[Ready] = pool.ready
    sizes = {(r.dense, r.multivector, r.unpadded) for r in ready}
    if len(sizes) != 1:
        pool.close(failed=True)
        raise WorkerError(
            f"the encoders on {', '.join(devices)} disagree on vector sizes or batch layout"
        )
    dense, multivector, unpadded = sizes.pop()
    budgets = [r.budget for r in ready if r.budget is not None]
    notices = tuple(dict.fromkeys(n for r in ready for n in r.notices))
    remarks = tuple(dict.fromkeys(n for r in ready for n in r.remarks))
    budget = min(budgets) if budgets else None
    # Devices of several kinds may each take another kernel.
    kernel = ",".join(sorted({r.kernel for r in ready if r.kernel is not None})) or None
    return pool, Ready(dense, multivector, budget, unpadded, kernel, notices, remarks)


@dataclass(frozen=True, slots=True)
class _Device:
    """What a worker needs to start its encoder."""

    spec: ModelSpec
    device: str
    dtype: str
    threads: int


@dataclass(frozen=True, slots=True)
class _Timed:
    """A worker's encoder, timing each batch it embeds."""

    encoder: Encoder

    def __call__(self, batch: TokenBatch | None) -> tuple[Embeddings | None, float, DeviceCounts]:
        """The batch's embeddings, the seconds they took, and what the encoder counted for
        it (`DeviceCounts`)."""
        if batch is None:  # a marker of the stream, sent back in its place
            return None, 0.0, DeviceCounts()
        started = time.perf_counter()
        before = self.encoder.counts.copy()
        embeddings = self.encoder.embed_within_memory(batch)
        return embeddings, time.perf_counter() - started, self.encoder.counts.since(before)


def _start(device: _Device) -> tuple[_Timed, Ready]:
    """A worker's encoder, and its vector sizes, probed token budget and batch layout."""
    import torch

    from bulkembed.encoders import start_encoder

    dtype = getattr(torch, device.dtype)
    encoder, budget = start_encoder(device.spec, device.device, dtype, device.threads)
    return _Timed(encoder), Ready.of(encoder, budget)


class EncoderPool:
    """One encoder process per device; `embed_stream` spreads batches over them. Where the
    budget is probed (`tunes_budget`), each worker probes its device's token budget
    (`Encoder.measure_budget`) and `budget` is the smallest, so that every batch
    fits every device. `warn` is told when a worker dies and its batches run again on the
    others. `counts` sums what the workers counted (their busy seconds as the mean
    device's)."""

    def __init__(
        self,
        spec: ModelSpec,
        devices: list[str],
        dtype_name: str,
        threads: int,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        self.devices = devices
        self._pool: WorkerPool[TokenBatch | None, tuple[Embeddings | None, float, DeviceCounts]]
        settings = [_Device(spec, d, dtype_name, threads) for d in devices]
        self._pool, self.ready = start_device_workers(_start, settings, "batch", warn)
        self.dense_dim, self.multivector_dim = self.ready.dense, self.ready.multivector
        self.unpadded = self.ready.unpadded
        self.attention_kernel = self.ready.kernel
        self.budget = self.ready.budget
        self.counts = DeviceCounts()

    def embed_stream(
        self,
        batches: Iterable[tuple[Key, TokenBatch | None]],
        finished: Callable[[Key, float, float], None],
    ) -> Iterator[tuple[Key, Embeddings | None]]:
        """Each `(key, batch)` with its embeddings, in order; `finished(key, seconds, 0)` as
        each one comes back, with its device time shared out over the devices (they run
        side by side). The next batches are taken and queued while the devices work. A
        `(key, None)` marker comes back in its place, as `Encoder.embed_stream` does."""
        in_flight = BATCHES_PER_WORKER * len(self.devices)
        for key, (embeddings, seconds, counts) in self._pool.map(batches, in_flight):
            # The devices run side by side: their busy seconds are the mean device's.
            self.counts.add(counts, share=1 / len(self.devices))
            if embeddings is not None:
                finished(key, seconds / len(self.devices), 0.0)
            yield key, embeddings

    def close(self) -> None:
        """Stop the workers: politely, then for good."""
        self._pool.close()

"""Several devices writing their own parts: one process per device embeds whole units and
commits them into the output (Parquet parts, or a LanceDB table's fragments); the run's
process handles only their order and the ledger.

The run's process reads and tokenizes, gathers the chunks (token ids, ids, hashes,
passthrough values) into windows exactly as a one-device run does, and hands each group of
windows from one unit's start to a unit's end to the device process that holds the fewest.
That process packs each window into batches, embeds them, and writes the windows' rows into
their parts on a thread of its own while it embeds the next window; once the group's units
are committed it answers with their records, bad records and counts, and the run's process
writes the quarantine and the done-markers in input order. No vector crosses between
processes, and with a budget given (not probed) the windows and batches, and so the
vectors, are those of a one-device run (`auto` lets each device pack by its own budget).

Each batch a device process finishes is reported to the run's process: it moves the
progress bar, and it is how a hung device is told from a busy one (`batch_timeout()`
without a batch fails the run, naming the device). A device process that dies has its
groups in flight embedded again by the others, whole, under the same part names, once
each, as the batch-level pool (`bulkembed.engine.pool`) does with batches.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from bulkembed.config import DType
from bulkembed.engine.modes import UpsertSinks, no_upserts, part_writer
from bulkembed.engine.pool import BATCHES_PER_WORKER, Ready, start_device_workers
from bulkembed.engine.session import DeviceSession, Unsettled, start_session
from bulkembed.engine.stream import EmbeddedWindow, embed_windows, part_schema
from bulkembed.reporting.progress import QuietReporter, RunStats
from bulkembed.workers import WorkerPool, report

if TYPE_CHECKING:
    from bulkembed.batching.tokenize import TokenizedChunk
    from bulkembed.contracts import UnitRecord
    from bulkembed.models.model_spec import ModelSpec
    from bulkembed.output.format import OutputFormat
    from bulkembed.sinks import Sink
    from bulkembed.sources import RecordReader

# Windows of tokenized chunks from one unit's start to a unit's end, as the run's process
# hands them to a device process (`bulkembed.batching.windows.windows` keeps it about a unit long).
UnitGroup = list[list["TokenizedChunk"]]


@dataclass(frozen=True, slots=True)
class UnitWork:
    """What a device process needs: the model in the run's dtype on its device, and where
    and how to write (`sink` makes the process's own sink, `upserts` its sink of the
    `--since` change set; the reader gives the id type and the passthrough columns)."""

    spec: ModelSpec
    reader: RecordReader
    output_format: OutputFormat
    sink: Callable[[], Sink]
    run_id: str
    fence: Callable[[], None]
    dtype: DType
    threads: int
    device: str = "cpu"
    upserts: UpsertSinks = no_upserts


@dataclass(frozen=True, slots=True)
class UnitDone:
    """A group of units committed by a device process: each unit's record and bad records,
    as the ledger takes them, and what embedding and writing them counted."""

    committed: list[tuple[UnitRecord, list[dict[str, Any]]]]
    stats: RunStats


# How often a device process tells the run's process how its group goes: a progress bar
# needs no more, and each message wakes the run's process (short documents make
# thousands of batches a minute).
HEARTBEAT_SECONDS = 0.25


@dataclass(frozen=True, slots=True)
class Counts:
    """What a device process has embedded of the group it is on, reported after each batch."""

    docs: int
    tokens: int
    padded_tokens: int
    batches: int


class _Heartbeat(QuietReporter):
    """A device process's reporter: the counts go to the run's process after a batch, at
    most every `HEARTBEAT_SECONDS` (the group's result carries the last ones)."""

    def __init__(self) -> None:
        super().__init__()
        self._sent = -HEARTBEAT_SECONDS

    def update(self, stats: RunStats) -> None:
        now = time.monotonic()
        if now - self._sent >= HEARTBEAT_SECONDS:
            self._sent = now
            report(Counts(stats.docs, stats.tokens, stats.padded_tokens, stats.batches))


class _UnitWorker:
    """In a device process: embeds a group of units window by window, and writes and
    commits their parts on a writer thread. One window is written while the next is
    embedded, never more, so memory holds two windows' vectors at most."""

    def __init__(self, work: UnitWork) -> None:
        self.work = work
        self.session: DeviceSession | Unsettled = start_session(
            work.spec, [work.device], work.dtype, work.threads, _Heartbeat()
        )
        schema = part_schema(work.reader, work.spec, self.session.embedder, work.output_format)
        self.writer = part_writer(
            work.upserts, work.run_id, work.sink(), schema, self._committed, work.fence
        )
        self.writes = ThreadPoolExecutor(1, thread_name_prefix="bulkembed-writer")
        self.last: Future[None] | None = None
        self.error: BaseException | None = None
        # Written on the writer thread only: the units committed since the last answer.
        self.committed: list[tuple[UnitRecord, list[dict[str, Any]]]] = []

    def _settled(self, session: DeviceSession) -> None:
        """The session the first documents settled: the next groups run on it."""
        self.session = session

    def _committed(self, record: UnitRecord, bad: list[dict[str, Any]]) -> None:
        self.committed.append((record, bad))

    def _write(self, window: EmbeddedWindow, stats: RunStats) -> None:
        if self.error is not None:
            return
        try:
            for _ in stats.timed_iterator("write", window.write(self.writer)):
                continue
        except BaseException as e:  # raised again with the group's answer
            self.error = e
            raise

    def _submit(self, window: EmbeddedWindow, stats: RunStats) -> None:
        if self.last is not None:
            self.last.result()
        self.last = self.writes.submit(self._write, window, stats)

    def _done(self, stats: RunStats) -> UnitDone:
        if self.error is not None:
            raise self.error
        committed, self.committed = self.committed, []
        return UnitDone(committed, stats)

    def __call__(self, group: UnitGroup) -> Future[UnitDone]:
        stats = RunStats()
        embed_windows(
            iter(group),
            self.session,
            self.work.output_format.apply,
            lambda window: self._submit(window, stats),
            stats,
            self.session.start.reporter,
            self._settled,
        )
        return self.writes.submit(self._done, stats)


def _start(work: UnitWork) -> tuple[_UnitWorker, Ready]:
    """A device process's worker, and what its encoder tells (`Ready`)."""
    from bulkembed.encoders import Encoder

    worker = _UnitWorker(work)
    embedder = worker.session.embedder
    assert isinstance(embedder, Encoder)
    return worker, Ready.of(embedder, worker.session.budget)


class UnitPool:
    """One device process per device (`_UnitWorker`), each embedding and committing groups
    of whole units. `dense_dim`, `multivector_dim` and `budget` (the smallest device's) are what the
    processes found as they started; `warn` is told when one dies."""

    def __init__(
        self, work: UnitWork, devices: list[str], warn: Callable[[str], None] | None = None
    ) -> None:
        self.devices = devices
        self._pool: WorkerPool[UnitGroup, UnitDone]
        settings = [replace(work, device=device) for device in devices]
        self._pool, self.ready = start_device_workers(_start, settings, "unit group", warn)
        self.dense_dim, self.multivector_dim = self.ready.dense, self.ready.multivector
        self.unpadded = self.ready.unpadded
        self.attention_kernel = self.ready.kernel
        assert self.ready.budget is not None
        self.budget = self.ready.budget

    def embed(
        self, groups: Iterable[UnitGroup], progress: Callable[[Counts], None]
    ) -> Iterator[UnitDone]:
        """Each group of units, embedded and committed, in the order given; `progress` gets
        the counts of the groups in flight as batches finish, summed."""
        moving: dict[int, Counts] = {}

        def reported(key: int, counts: Counts) -> None:
            moving[key] = counts
            progress(
                Counts(*(sum(getattr(c, f) for c in moving.values()) for f in Counts.__slots__))
            )

        in_flight = BATCHES_PER_WORKER * len(self.devices)
        numbered = ((number, group) for number, group in enumerate(groups))
        for number, done in self._pool.map(numbered, in_flight, reported):
            moving.pop(number, None)
            yield done

    @property
    def pids(self) -> list[int]:
        """The device processes' ids (they tag their temporary files with them)."""
        return self._pool.pids

    def close(self, failed: bool = False) -> None:
        """Stop the device processes: politely, then for good; after a failure, at once."""
        self._pool.close(failed)

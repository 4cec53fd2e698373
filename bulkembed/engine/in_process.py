"""Embedding in the run's own process: one device (or the CPU), windows embedded one after
another and written behind by a thread (`WriteBehind`). A run whose mode knows the vectors'
sizes without the model (an incremental run) writes what it carries over first and loads
the model only when a document to embed comes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from itertools import chain
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from bulkembed.batching.packing import BatchPolicy
from bulkembed.batching.tokenize import TokenizedChunk
from bulkembed.contracts import Embeddings
from bulkembed.engine.int8_check import Int8Record
from bulkembed.engine.modes import RunMode, part_writer
from bulkembed.engine.plan import RunOutcome, RunPlan
from bulkembed.engine.saved import OpenRows, kept_documents, save_rows, window_rows
from bulkembed.engine.session import DeviceSession, Unsettled, start_session
from bulkembed.engine.stopping import StopRequest
from bulkembed.engine.stream import (
    CalibratingFormat,
    EmbeddedWindow,
    PartlyEmbedded,
    embed_windows,
    gather_windows,
    part_schema,
)
from bulkembed.engine.writer import PartWriter, WriteBehind
from bulkembed.errors import BulkembedError, Interrupted, OutputError
from bulkembed.reporting.progress import Reporter, RunStats
from bulkembed.sources import count_records

if TYPE_CHECKING:
    from bulkembed.contracts import UnitRecord
    from bulkembed.encoders.base import VectorSizes
    from bulkembed.output.format import OutputFormat
    from bulkembed.run_dir import RunDirectory
    from bulkembed.sinks import Sink


def start_counting(plan: RunPlan, reporter: Reporter) -> None:
    """Count the documents in the background, for the progress bar's total and ETA."""
    limit = plan.config.inputs.limit

    def count() -> None:
        try:
            total = count_records(list(plan.files))
        except BulkembedError:
            # A store that fails here fails the run's own reading too, which says so.
            return
        reporter.set_total(min(total, limit) if limit is not None else total)

    threading.Thread(target=count, name="bulkembed-count", daemon=True).start()


@dataclass(frozen=True, slots=True)
class Writing:
    """Where this process writes what it embeds."""

    run: RunDirectory
    sink: Sink
    output_format: OutputFormat
    mode: RunMode
    # The output is read as it is written (`Capabilities.streamed`).
    streamed: bool = False


def embed_in_process(
    plan: RunPlan,
    writing: Writing,
    tokenized: Iterator[TokenizedChunk],
    stats: RunStats,
    done: dict[str, UnitRecord],
    reporter: Reporter,
    stop: StopRequest,
) -> RunOutcome:
    """Embed on the run's devices in this process, and write behind. Where the mode knows
    the vectors' sizes without the model (`RunMode.sizes`), the documents it carries over
    are written first, and the model is loaded when the first document to embed comes:
    never, when there is none. Asked to `stop`, the run saves what it embedded and raises
    `Interrupted` (`bulkembed.engine.saved`)."""
    config, devices = plan.config, list(plan.devices)
    sizes = writing.mode.sizes()
    writer: PartWriter | None = None
    # The session started, then the one the first document settled it into, if another.
    sessions: list[DeviceSession | Unsettled] = []
    try:
        if sizes is not None:
            budget = BatchPolicy.of(plan.spec).tokens
            line = plan.start_line(sizes, budget, len(done), "")
            reporter.info(f"{line}; {writing.mode.describe()}")
            writer = _start_writing(plan, writing, sizes, stats, reporter)
            first = _write_carried(tokenized, writer, stats, reporter)
            if first is None:
                return RunOutcome(stats, ",".join(devices), plan.dtype, budget)
            tokenized = chain([first], tokenized)
        int8_record = Int8Record.of(writing.run)
        session = start_session(
            plan.spec, devices, config.batching.dtype, None, reporter, int8_record
        )
        sessions.append(session)
        if writer is None:
            mode = writing.mode.describe()
            reporter.info(plan.start_line(session.embedder, session.budget, len(done), mode))
            writer = _start_writing(plan, writing, session.embedder, stats, reporter)
        elif _writer_schema(plan, writing, session.embedder) != writer.schema:
            raise OutputError(
                f"the model gives other vectors than {writing.mode.describe()}: run without --since"
            )
        with stop.graceful(reporter.warn):
            unfinished = _embed_and_write(
                writing, session, writer, tokenized, stats, reporter, sessions.append, stop
            )
        if stop.requested:
            raise _saved_on_stop(plan, writing, writer, unfinished, stop)
        session = sessions[-1]
        return RunOutcome(
            stats,
            ",".join(devices),
            session.dtype,
            session.budget,
            session.precision,
            session.backend,
            session.attention,
            session.embedder.attention_kernel,
        )
    finally:
        if writer is not None:
            writer.close()
            reporter.close()
        for started in sessions:
            started.close()


def _writer_schema(plan: RunPlan, writing: Writing, sizes: VectorSizes) -> pa.Schema:
    return part_schema(plan.reader, plan.spec, sizes, writing.output_format)


def _start_writing(
    plan: RunPlan, writing: Writing, sizes: VectorSizes, stats: RunStats, reporter: Reporter
) -> PartWriter:
    """The writer of this process's parts (and upserts), for vectors of `sizes`; the
    progress starts with it."""
    run = writing.run
    schema = _writer_schema(plan, writing, sizes)
    upserts = writing.mode.upserts()
    writer = part_writer(upserts, run.run_id, writing.sink, schema, run.committed, run.lock.check)
    reporter.start(stats)
    if plan.my_units is None:
        start_counting(plan, reporter)
    return writer


def _write_carried(
    tokenized: Iterator[TokenizedChunk], writer: PartWriter, stats: RunStats, reporter: Reporter
) -> TokenizedChunk | None:
    """Write the chunks that hold nothing to embed (rows carried over, bad records) as they
    come; the first chunk with a document to embed, or None when none comes."""
    for chunk in tokenized:
        if len(chunk.chunk.ids):
            return chunk
        stats.stages["tokenize"] += chunk.seconds
        window = EmbeddedWindow([chunk], Embeddings(), np.empty(0, dtype=np.int64))
        for _ in stats.timed_iterator("write", window.write(writer)):
            continue
        carried = chunk.chunk.carried
        if carried is not None:
            saved = int(carried.saved_rows.sum())
            stats.saved += saved
            stats.carried += len(carried.records.positions) - saved
        reporter.update(stats)
    return None


def _embed_and_write(
    writing: Writing,
    session: DeviceSession | Unsettled,
    writer: PartWriter,
    tokenized: Iterator[TokenizedChunk],
    stats: RunStats,
    reporter: Reporter,
    settled: Callable[[DeviceSession], None],
    stop: StopRequest,
) -> list[PartlyEmbedded]:
    """Embed window after window in `session`, written behind by `writer`; the session
    the first document settles it into goes to `settled`. Asked to `stop`, the windows
    embedded whole are written, and those embedded in part returned, their vectors as the
    output stores them."""
    writer.open_rows = OpenRows()
    with WriteBehind[EmbeddedWindow](
        lambda window: stats.timed_iterator("write", window.write(writer))
    ) as behind:
        formatted = CalibratingFormat(writing.output_format, writing.run)
        # A stream's reader gets each unit's rows as soon as they are embedded.
        per_unit = writing.streamed
        gathered = gather_windows(
            stop.until(tokenized), session.embedder, session.budget, stats, per_unit
        )
        unfinished = embed_windows(
            gathered, session, formatted, behind.submit, stats, reporter, settled, stop.check
        )
        behind.finish()
        stats.end_embedding()
        # The rates shown last are the summary's, to the end of the embedding.
        reporter.update(stats)
    if formatted.output_format.needs_ranges:
        # int8/uint8 ranges are calibrated on the first window: one cut short is not saved.
        return []
    return [replace(w, vectors=formatted(w.vectors)) for w in unfinished]


def _saved_on_stop(
    plan: RunPlan,
    writing: Writing,
    writer: PartWriter,
    unfinished: list[PartlyEmbedded],
    stop: StopRequest,
) -> Interrupted:
    """Save the rows embedded but not committed (`bulkembed.engine.saved`); the error
    that ends the run, which says what is kept and what remains."""
    assert writer.open_rows is not None and stop.signal_number is not None
    if writing.streamed:
        return Interrupted(
            stop.signal_number,
            f"stopped by {stop.name}: the records embedded before it are on stdout; a stream "
            "does not resume: run the command again to start over",
        )
    rows = writer.open_rows.batches()
    for window in unfinished:
        rows += window_rows(window.chunks, window.rows, window.vectors, writer.schema)
    run = writing.run
    save_rows(run.meta, rows)
    kept = kept_documents(run, list(plan.files))
    return Interrupted(
        stop.signal_number,
        f"stopped by {stop.name}: {kept.describe()}; run the same command again to resume",
    )

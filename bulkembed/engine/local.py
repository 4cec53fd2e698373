"""The local engine: every pending unit streams through this machine's processes.

Records stream from the inputs (done units skipped), lose repeated ids, stop at `--limit`,
and go to tokenizer processes that run ahead of the model, up to a window, from the moment
the run starts (the first window is tokenized while the model loads). The unit loop
(`embed_windows`) embeds them window by window on the run's devices, and a write-behind
thread writes each window into its units' parts while the next one is embedded; a unit's
part is committed, then marked done, with its last chunk. With several devices and a
Parquet or LanceDB output the same windows go, a unit group at a time, to device processes
that embed and commit them themselves (`UnitPool`), and this process marks their units done.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace
from itertools import chain
from typing import TYPE_CHECKING

from bulkembed.batching.admission import (
    drop_duplicate_ids,
    fail_on_bad_records,
    leave_id_hashes,
    set_aside,
    take,
)
from bulkembed.batching.tokenize import TokenizedChunk, TokenizerPool
from bulkembed.batching.windows import share_of_window
from bulkembed.config import Attention, OnBadRecord
from bulkembed.encoders.registry import read_ahead_budget
from bulkembed.engine.ahead import ReadAhead
from bulkembed.engine.calibration import calibrate_ahead
from bulkembed.engine.in_process import Writing, embed_in_process, start_counting
from bulkembed.engine.modes import RunMode
from bulkembed.engine.plan import RunOutcome, RunPlan
from bulkembed.engine.saved import SavedVectors
from bulkembed.engine.session import load_ahead, settle_dtype, tell
from bulkembed.engine.stopping import StopRequest
from bulkembed.engine.stream import (
    gather_windows,
    resumed_output_format,
)
from bulkembed.engine.unit_pool import Counts, UnitPool, UnitWork
from bulkembed.models.devices import cpu_threads_per_worker
from bulkembed.reporting.progress import Reporter, RunStats
from bulkembed.sources import SeenIds

if TYPE_CHECKING:
    from bulkembed.contracts import UnitRecord
    from bulkembed.incremental.carry import CarryOver
    from bulkembed.output.format import OutputFormat
    from bulkembed.run_dir import RunDirectory
    from bulkembed.sinks import Sink


def _admitted(
    plan: RunPlan,
    sink: Sink,
    done: dict[str, UnitRecord],
    carrier: CarryOver,
    tokenized: Iterable[TokenizedChunk],
    stats: RunStats,
    saved: SavedVectors | None,
) -> Iterator[TokenizedChunk]:
    """The tokenized records still to embed: first id wins (the ids of done units count
    as seen), up to the limit; `carrier` (the mode's) carries over those it can, and
    `saved` takes those an interrupted run saved. They are counted as read into `stats`."""
    config = plan.config
    seen = SeenIds(plan.id_key)
    mine = {k: v for k, v in done.items() if plan.my_units is None or k in plan.my_units}
    seen.add_all(sink.committed_ids(mine))
    files = list(plan.files)
    chunks = drop_duplicate_ids(set_aside(tokenized, files), seen, files)
    if config.inputs.limit is not None:
        chunks = take(chunks, config.inputs.limit - sum(r.rows for r in done.values()))
    if config.run.on_bad_record is OnBadRecord.FAIL:
        chunks = fail_on_bad_records(chunks)
    chunks = carrier.carry(chunks)
    if saved is not None:
        chunks = saved.carry(chunks)
    return _counted(leave_id_hashes(chunks), stats)


def _counted(chunks: Iterable[TokenizedChunk], stats: RunStats) -> Iterator[TokenizedChunk]:
    """`chunks`, their documents (carried over too) and the tokens of those to embed
    counted as read into `stats` (the ETA reckons with them)."""
    for tokenized in chunks:
        carried = tokenized.chunk.carried
        stats.read += len(tokenized.lengths)
        stats.read += 0 if carried is None else len(carried.records.positions)
        stats.read_tokens += int(tokenized.lengths.sum())
        yield tokenized


def embed_locally(
    plan: RunPlan,
    run: RunDirectory,
    sink: Sink,
    done: dict[str, UnitRecord],
    mode: RunMode,
    reporter: Reporter,
    stop: StopRequest,
) -> RunOutcome:
    """Embed every unit not in `done` (nor outside this `--shard`'s share) into `sink`, as
    `mode` says (rows carried over, each unit's upserts). With one device, `stop` asked
    (SIGINT, SIGTERM) saves what is embedded but not committed, which the next run takes
    (`bulkembed.engine.saved`).

    Reading and tokenizing start first, on a thread (`ReadAhead`), so that the first window
    is tokenized while the model loads."""
    devices = list(plan.devices)
    stats = RunStats(started=plan.started)
    chunks = stats.timed_iterator("read", plan.reader.read(skip=mode.pending(done).skipped))
    # Read ahead by the budget the run will batch by (an earlier run's probe's, where one
    # found it on this device and this run probes too).
    budget = read_ahead_budget(plan.spec, devices[0], plan.dtype)
    output_format = resumed_output_format(plan.output_format, run, done)
    carrier = mode.carrier()
    if mode.sizes() is None:
        # A model will be needed (one that may not be carries over what it can first).
        load_ahead("cpu" in devices and plan.spec.backend != "torch")
    settings = plan.tokenizer_settings
    with TokenizerPool(settings, plan.workers, plan.id_key, previous=carrier.lookup) as pool:
        saved = SavedVectors.open(run, done, reporter.warn)
        admitted = _admitted(plan, sink, done, carrier, pool.map(chunks), stats, saved)
        with ReadAhead(admitted, lambda c: share_of_window(c, budget)) as tokenized:
            if len(devices) > 1 and plan.target.capabilities.many_writers:
                return _embed_on_devices(
                    plan,
                    run,
                    sink,
                    iter(tokenized),
                    output_format,
                    stats,
                    done,
                    mode,
                    reporter,
                )
            streamed = plan.target.capabilities.streamed
            writing = Writing(run, sink, output_format, mode, streamed)
            return embed_in_process(plan, writing, iter(tokenized), stats, done, reporter, stop)


def _unit_groups(gathered: Iterator[list[TokenizedChunk]]) -> Iterator[list[list[TokenizedChunk]]]:
    """Windows grouped from one unit's start to a unit's end: what one device process
    embeds and commits (see `windows`: a group is about a unit long)."""
    group: list[list[TokenizedChunk]] = []
    for window in gathered:
        group.append(window)
        if window[-1].chunk.last_in_unit:
            yield group
            group = []
    assert not group, "a unit's last chunk never came"


def _embed_on_devices(
    plan: RunPlan,
    run: RunDirectory,
    sink: Sink,
    tokenized: Iterator[TokenizedChunk],
    output_format: OutputFormat,
    stats: RunStats,
    done: dict[str, UnitRecord],
    mode: RunMode,
    reporter: Reporter,
) -> RunOutcome:
    """Several devices and an output that takes rows from several processes (Parquet,
    LanceDB): one process per device embeds whole units and commits their parts
    (`UnitPool`); this process settles the dtype and calibrates int8/uint8 ranges first
    (`calibrate_ahead`), then reads, tokenizes, and writes each unit's quarantine and
    done-marker as the units come back in input order."""
    config = plan.config
    devices = list(plan.devices)
    dtype, precision, read = settle_dtype(
        plan.spec, devices[0], config.batching.dtype, tokenized, reporter
    )
    threads = cpu_threads_per_worker(devices)
    if output_format.needs_ranges:
        output_format, read = calibrate_ahead(
            plan.spec,
            devices[0],
            dtype,
            threads,
            chain(read, tokenized),
            output_format,
            run,
            reporter,
        )
    work = UnitWork(
        plan.spec,
        plan.reader,
        output_format,
        sink.process_copies(),
        run.run_id,
        run.fence(),
        dtype,
        threads,
        upserts=mode.upserts(),
    )
    reporter.phase(f"loading the model on {', '.join(devices)}")
    pool = UnitPool(work, devices, reporter.warn)
    tell(reporter, pool.ready.notices, pool.ready.remarks)
    stopped = True
    try:
        reporter.info(plan.start_line(pool, pool.budget, len(done), mode.describe()))
        # The device processes have loaded the model: the first group goes out now.
        stats.begin_embedding()
        reporter.start(stats)
        if plan.my_units is None:
            start_counting(plan, reporter)

        def progress(moving: Counts) -> None:
            shown = replace(stats, stages={})
            shown.docs += moving.docs
            shown.tokens += moving.tokens
            shown.padded_tokens += moving.padded_tokens
            shown.batches += moving.batches
            reporter.update(shown)

        try:
            gathered = gather_windows(chain(read, tokenized), pool, pool.budget, stats)
            for unit in pool.embed(_unit_groups(gathered), progress):
                for record, bad in unit.committed:
                    run.committed(record, bad)
                # The devices run side by side: their seconds are the mean device's.
                stats.add(unit.stats, share=1 / len(devices))
                reporter.update(stats)
            stats.end_embedding()
            # The rates shown last are the summary's, to the end of the embedding.
            reporter.update(stats)
        finally:
            reporter.close()
        stopped = False
    finally:
        # Stopped (an error, Ctrl-C), the device processes go at once, rather than commit
        # more units that this process would not mark done.
        pool.close(failed=stopped)
        # What a device process that died (or was stopped) was writing.
        sink.abandon(pool.pids)
    attention = Attention.ran(pool.unpadded).value
    return RunOutcome(
        stats,
        ",".join(devices),
        dtype.value,
        pool.budget,
        precision,
        None,
        attention,
        pool.attention_kernel,
    )

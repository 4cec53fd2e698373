"""`embed_corpus`: one `bulkembed run` from configuration to summary.

The run is planned (`plan_run`), its run directory opened (lock, fingerprint, ledger mended
against the output), and the pending units handed to an engine: the local one, or Ray's.
Both take the same plan and commit units the same way; they differ only in how they hand
out the units. Afterwards the quarantine is rebuilt from the markers, the output marked
complete once every unit is done, and the summary written.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bulkembed.config import Engine, RunConfig
from bulkembed.contracts import UnitRecord
from bulkembed.engine.modes import PlainRun, RunMode
from bulkembed.engine.plan import RunOutcome, RunPlan, plan_run
from bulkembed.engine.since import mode_of
from bulkembed.engine.sync import TableSync, refuse_synced, syncs_in_place
from bulkembed.errors import BulkembedError, Interrupted, OutputLocked, exit_status, one_line
from bulkembed.incremental import ChangeSet
from bulkembed.progress import QuietReporter, Reporter, RunStats
from bulkembed.recorded import encoder_record
from bulkembed.run_dir import LockedError, RunDirectory, fingerprint
from bulkembed.run_dir.intents import Intents, finishing
from bulkembed.sinks import Sink, SinkSettings, make_sink
from bulkembed.storage import remove_scratch
from bulkembed.summary import Summary, check_bad_records, check_deletes, summarize
from bulkembed.version import __version__
from bulkembed.wording import counted

if TYPE_CHECKING:
    from bulkembed.precision import PrecisionCheck


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[None]:
    """Turn SIGINT and SIGTERM into `Interrupted`, so that cleanup runs and the lock drops."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signal_number: int, frame: object) -> None:
        name = signal.Signals(signal_number).name
        raise Interrupted(
            signal_number,
            f"stopped by {name}: committed parts are kept; run the same command again to resume",
        )

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def _command_start() -> float:
    """When the command started, on the monotonic clock: when this process started, if it
    is the `bulkembed` command (its imports count; Linux tells, from /proc); else now, the
    call of the Python API."""
    now = time.monotonic()
    main = Path(sys.argv[0]) if sys.argv else Path()
    if main.name != "bulkembed" and (main.name, main.parent.name) != ("__main__.py", "bulkembed"):
        return now
    try:
        with open("/proc/self/stat", encoding="ascii") as stat:
            # Field 22, after the command's name in parentheses: clock ticks since boot.
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return now
    return now - max(0.0, age)


def embed_corpus(config: RunConfig, reporter: Reporter | None = None) -> Summary:
    """Embed every document of `config.inputs` into `config.output`; return the summary.

    An output that holds an unfinished run with the same settings is resumed; a finished
    one is left as it is."""
    started = _command_start()
    reporter = reporter or QuietReporter()
    with _stop_on_signals(), contextlib.closing(reporter):
        # Closed on the way out: a phase may hold the terminal (listing inputs, an index).
        plan = plan_run(config, reporter, started)
        if syncs_in_place(plan):
            summary, precision = _sync(plan, reporter)
        else:
            refuse_synced(plan)
            run = RunDirectory.for_target(plan.target, config.shard, config.break_lock)
            settings = SinkSettings.of(config, plan.spec.normalize, Intents(run.meta))
            sink = make_sink(plan.target, settings)
            try:
                summary, precision = _run(plan, run, sink, reporter)
            finally:
                if plan.target.run_directory is None and isinstance(run.meta, Path):
                    # A stream's bookkeeping: a temporary directory of its own.
                    remove_scratch(run.meta)
    reporter.finish(summary.as_dict())
    if precision is not None and not precision.passed:
        # Said again last: a run several times slower than it could be is worth a look.
        reporter.warn(f"this run computed in float32: --dtype auto: {precision.describe()}")
    check_bad_records(summary, config.max_bad_records)
    check_deletes(summary, config.max_deletes)
    return summary


def _sync(plan: RunPlan, reporter: Reporter) -> tuple[Summary, PrecisionCheck | None]:
    """Sync the `--output` LanceDB table in place (`bulkembed.engine.sync`); the summary
    goes to the table's run directory too."""
    settings = fingerprint(plan.config, plan.spec, list(plan.files))
    sync = TableSync(plan, settings)
    sync.lock()
    try:
        staged, run, sink = sync.staging(plan)
        summary, precision = _run(staged, run, sink, reporter, sync)
        sync.table_run.write_summary(summary.as_dict())
        return summary, precision
    finally:
        sync.unlock()


def _run(
    plan: RunPlan,
    run: RunDirectory,
    sink: Sink,
    reporter: Reporter,
    sync: TableSync | None = None,
) -> tuple[Summary, PrecisionCheck | None]:
    """Open the run directory, embed what is pending, write the summary; the summary and
    the `--dtype auto` check, if one was made. With `sync`, the run is an in-place sync of
    a LanceDB table, `run` and `sink` its own."""
    config = plan.config
    resumable = plan.target.capabilities.resumable
    settings = fingerprint(config, plan.spec, list(plan.files))
    done = run.open(settings, config.overwrite, sink, plan.my_units)
    for repair in run.repairs:
        reporter.warn(repair)
    mode: RunMode = PlainRun()
    try:
        run.clear_failure()
        if config.overwrite and resumable:
            ChangeSet(run.meta).remove()
        mode = mode_of(plan, run, sink, settings, sync)
        complete = mode.start(done, run.is_complete())
        _write_config(plan, run, settings, mode)
        limited = config.limit is not None
        if complete:
            reporter.info(f"nothing to do: {plan.target.label} already holds every document")
            stats = RunStats(started=plan.started)
            return summarize(done, stats, plan.run_info(), mode.changes(), limited), None
        outcome = _dispatch(plan, run, sink, done, mode, reporter)
        _finish_if_whole(plan, run, sink, reporter, mode.end(reporter.phase))
        done = run.done_units()
        # Lines a unit written twice (a lost Ray actor's) appended twice go.
        run.rebuild_quarantine(done, plan.my_units)
        info = plan.run_info(outcome)
        summary = summarize(done, outcome.stats, info, mode.changes(), limited)
        run.write_summary(summary.as_dict())
        return summary, outcome.precision
    except Exception as e:
        if resumable and not isinstance(e, (Interrupted, OutputLocked)):
            # Where the record cannot be written either (the full disk that ended the run),
            # `status` says stopped, and the run's own error is what the caller sees.
            with contextlib.suppress(OSError, BulkembedError):
                run.record_failure(exit_status(e), one_line(e))
        raise
    finally:
        mode.close()
        if not resumable:
            _report_bad_records(run, reporter)
        run.release_lock()


def _write_config(
    plan: RunPlan, run: RunDirectory, settings: dict[str, Any], mode: RunMode
) -> None:
    """`config.json`: the fingerprint, the inputs, the model and the settings its vectors
    were made with (`recorded`), and what an incremental run keeps across restarts;
    `vocab.json` for sparse outputs."""
    spec_fields = {k: v for k, v in asdict(plan.spec).items() if k != "tokenizer_json"}
    paths = [{"name": f.name, "path": str(f.path)} for f in plan.files]
    run.write_config(
        {
            "version": __version__,
            "fingerprint": settings,
            "input_paths": paths,
            "model": spec_fields,
            "encoder": encoder_record(plan.spec, plan.output_format),
            **mode.state(),
            "records_per_unit": plan.config.records_per_unit,
            **plan.run_info(),
        }
    )
    if "sparse" in plan.spec.outputs:
        _write_vocabulary(run, plan)


def _dispatch(
    plan: RunPlan,
    run: RunDirectory,
    sink: Sink,
    done: dict[str, UnitRecord],
    mode: RunMode,
    reporter: Reporter,
) -> RunOutcome:
    """Hand the pending units to the engine the configuration names."""
    if plan.config.engine is Engine.RAY:
        from bulkembed.engine.ray import embed_on_ray

        return embed_on_ray(plan, run, sink, done, mode, reporter)
    from bulkembed.engine.local import embed_locally

    return embed_locally(plan, run, sink, done, mode, reporter)


def _finish_if_whole(
    plan: RunPlan,
    run: RunDirectory,
    sink: Sink,
    reporter: Reporter,
    before_complete: Callable[[], None] | None = None,
) -> None:
    """Once every unit is done, finish the output (`Sink.finish`) and mark it complete: at
    once for a whole run; for a `--shard` run, when the other shards' units are done too.
    `before_complete` runs just before the output is marked complete (`--since`: the
    deletes, and the units of rows kept).
    Shard runs that find every unit done at the same moment take turns: the first finishes,
    the others find the output complete, or leave it to the one finishing it."""
    done = run.done_units()
    if plan.my_units is not None:
        assert plan.all_units is not None and plan.config.shard is not None
        pending = [u for u in plan.all_units if u not in done]
        if pending:
            reporter.info(
                f"shard {plan.config.shard.label} is done; "
                f"{counted(len(pending), 'unit')} of other shards are pending"
            )
            return
    try:
        with finishing(run.meta, run.label):
            # Read again: another shard may have finished (and kept units) meanwhile.
            if not run.is_complete(run.done_units()):
                run.lock.check()
                sink.finish(reporter.phase)
                if before_complete is not None:
                    before_complete()
                run.mark_complete(len(run.done_units()))
    except LockedError:
        reporter.info(f"every unit is done; another run is finishing {run.label}")


def _write_vocabulary(run: RunDirectory, plan: RunPlan) -> None:
    """`vocab.json`, a list of tokens where the position is the vocabulary id (`vocab[i]`
    is the term of sparse index `i`; null for an id the tokenizer has no token for)."""
    from tokenizers import Tokenizer

    vocabulary = Tokenizer.from_str(plan.spec.tokenizer_json).get_vocab(with_added_tokens=True)
    tokens: list[str | None] = [None] * (max(vocabulary.values(), default=-1) + 1)
    for token, i in vocabulary.items():
        tokens[i] = token
    run.write_vocabulary(tokens)


def _report_bad_records(run: RunDirectory, reporter: Reporter) -> None:
    """A stream keeps no run directory: its bad records go to stderr, one JSON line each."""
    if run.bad_records_path.exists():
        for line in run.bad_records_path.read_text(encoding="utf-8").splitlines():
            reporter.info(f"bad record: {line}")

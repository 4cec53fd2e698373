"""`embed_corpus`: one `bulkembed run` from configuration to summary.

The run is planned (`plan_run`, which picks its mode), its output opened by the mode (lock,
fingerprint, ledger mended against the output), and the pending units handed to an engine:
the local one, or Ray's. Both take the same plan and commit units the same way; they differ
only in how they hand out the units. Afterwards the quarantine is rebuilt from the markers,
the output marked complete once every unit is done, and the summary written.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from bulkembed.config import Engine, RunConfig
from bulkembed.engine.modes import OpenedRun, RunMode
from bulkembed.engine.plan import RunOutcome, RunPlan, plan_run
from bulkembed.engine.stopping import StopRequest
from bulkembed.errors import Interrupted
from bulkembed.reporting.progress import QuietReporter, Reporter, RunStats
from bulkembed.reporting.summary import Summary, check_bad_records, check_deletes, summarize
from bulkembed.run_dir import LockedError
from bulkembed.run_dir.intents import finishing
from bulkembed.wording import counted

if TYPE_CHECKING:
    from bulkembed.engine.precision import PrecisionCheck


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[StopRequest]:
    """Turn SIGINT and SIGTERM into a request to stop where the run keeps its work
    (`StopRequest`), or else into `Interrupted`, so that cleanup runs and the lock drops."""
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return

    def stop(signal_number: int, frame: object) -> None:
        if request.ask(signal_number):
            return
        name = signal.Signals(signal_number).name
        raise Interrupted(
            signal_number,
            f"stopped by {name}: committed parts are kept; run the same command again to resume",
        )

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield request
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
    """Embed every document of the inputs of `config` into its output; return the summary.

    An output that holds an unfinished run with the same settings is resumed; a finished
    one is left as it is."""
    started = _command_start()
    reporter = reporter or QuietReporter()
    settings = config.run
    if settings.metrics_port is not None or settings.metrics_file is not None:
        from bulkembed.reporting.metrics import MetricsReporter

        port, path = settings.metrics_port, settings.metrics_file
        reporter = MetricsReporter(reporter, config.output.target, port, path)
    with _stop_on_signals() as stop, contextlib.closing(reporter):
        # Closed on the way out: a phase may hold the terminal (listing inputs, an index).
        plan = plan_run(config, reporter, started)
        summary, precision = run_plan(plan, reporter, stop)
    reporter.finish({**summary.as_dict(), "model": plan.model_shown})
    if precision is not None and not precision.passed and precision.bar is None:
        # Said again last: a run several times slower than it could be is worth a look (not
        # an int8 one: float32 is what it would have run in without int8).
        reporter.warn(f"this run computed in float32: --dtype auto: {precision.describe()}")
    check_bad_records(summary, config.run.max_bad_records)
    check_deletes(summary, config.run.max_deletes)
    return summary


def run_plan(
    plan: RunPlan, reporter: Reporter, stop: StopRequest | None = None
) -> tuple[Summary, PrecisionCheck | None]:
    """Run `plan` as its mode says: open the output, hand the pending units to an engine,
    finish the output once every unit is done, and write the summary; the summary and the
    `--dtype auto` check, if one was made. `stop` is asked by SIGINT and SIGTERM."""
    mode = plan.mode
    limited = plan.config.inputs.limit is not None
    with mode.open(plan, reporter) as opened:
        if opened.complete:
            stats = RunStats(started=plan.started)
            summary = summarize(opened.done, stats, plan.run_info(), mode.changes(), limited)
            mode.finish(summary)
            return summary, None
        outcome = _dispatch(opened, mode, reporter, stop or StopRequest())
        _finish_if_whole(opened, reporter, mode.end(reporter.phase))
        run = opened.run
        done = run.done_units()
        # Lines a unit written twice (a lost Ray actor's) appended twice go.
        run.rebuild_quarantine(done, opened.plan.my_units)
        info = opened.plan.run_info(outcome)
        summary = summarize(done, outcome.stats, info, mode.changes(), limited)
        run.write_summary(summary.as_dict())
        mode.finish(summary)
        return summary, outcome.precision


def _dispatch(
    opened: OpenedRun, mode: RunMode, reporter: Reporter, stop: StopRequest
) -> RunOutcome:
    """Hand the pending units to the engine the configuration names."""
    plan, run, sink, done = opened.plan, opened.run, opened.sink, opened.done
    if plan.config.run.engine is Engine.RAY:
        from bulkembed.engine.ray import embed_on_ray

        return embed_on_ray(plan, run, sink, done, mode, reporter)
    from bulkembed.engine.local import embed_locally

    return embed_locally(plan, run, sink, done, mode, reporter, stop)


def _finish_if_whole(
    opened: OpenedRun, reporter: Reporter, before_complete: Callable[[], None] | None
) -> None:
    """Once every unit is done, finish the output (`Sink.finish`) and mark it complete: at
    once for a whole run; for a `--shard` run, when the other shards' units are done too.
    `before_complete` runs just before the output is marked complete (`--since`: the
    deletes, and the units of rows kept).
    Shard runs that find every unit done at the same moment take turns: the first finishes,
    the others find the output complete, or leave it to the one finishing it."""
    plan, run, sink = opened.plan, opened.run, opened.sink
    done = run.done_units()
    if plan.my_units is not None:
        assert plan.all_units is not None and plan.config.run.shard is not None
        pending = [u for u in plan.all_units if u not in done]
        if pending:
            reporter.info(
                f"shard {plan.config.run.shard.label} is done; "
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

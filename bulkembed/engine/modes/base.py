"""What every run mode shares: the protocol the engines ask, and opening a run directory.

A mode opens its output (`RunMode.open`): it takes the locks, opens the run directory and
the sink, reads what it needs before units run, and keeps its own state in the run
directory's mode file. `embed_corpus` then hands the pending units (`RunMode.pending`) to an
engine, and asks the mode what to carry over, what to write besides each unit (upserts) and
what to do once every unit is done; it never asks which mode it is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterator
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from bulkembed.batching.units import PendingUnits
from bulkembed.engine.modes.upserts import UpsertSinks, no_upserts
from bulkembed.errors import BulkembedError, Interrupted, OutputLocked, exit_status, one_line
from bulkembed.incremental.carry import CarryOver
from bulkembed.output.recorded import encoder_record
from bulkembed.run_dir import RunDirectory, fingerprint
from bulkembed.run_dir.intents import Intents
from bulkembed.sinks import Sink, SinkSettings, change_set_of, make_sink
from bulkembed.storage import remove_scratch
from bulkembed.version import __version__

if TYPE_CHECKING:
    from bulkembed.contracts import UnitRecord
    from bulkembed.encoders.base import VectorSizes
    from bulkembed.engine.plan import RunPlan
    from bulkembed.reporting.progress import Reporter
    from bulkembed.reporting.summary import PreviousCounts, Summary


@dataclass(frozen=True)
class OpenedRun:
    """An output its mode opened: the plan the units run under (an in-place sync's writes
    the sync's own directory), the run directory, the sink, the done units, and whether the
    output is complete: then nothing is dispatched (the mode said so, and why)."""

    plan: RunPlan
    run: RunDirectory
    sink: Sink
    done: dict[str, UnitRecord]
    complete: bool


class RunMode(Protocol):
    """What `embed_corpus` and the engines ask of a run's mode."""

    def open(self, plan: RunPlan, reporter: Reporter) -> AbstractContextManager[OpenedRun]:
        """Lock and open the output of `plan` and read what the mode needs; on the way out,
        let go of it (an error is recorded for `bulkembed status`)."""
        ...

    def pending(self, done: Collection[str]) -> PendingUnits:
        """The units that remain, given the done ones."""
        ...

    def describe(self) -> str:
        """The start-up line's words on the mode ("" for none)."""
        ...

    def carrier(self) -> CarryOver:
        """What carries unchanged records over from a previous output
        (`bulkembed.incremental.carry`); its lookup lets tokenizers leave unchanged texts
        untokenized."""
        ...

    def sizes(self) -> VectorSizes | None:
        """The sizes of the vectors the run writes, where known without the model."""
        ...

    def upserts(self) -> UpsertSinks:
        """What makes each writing process's sink of upserts."""
        ...

    def end(self, phase: Callable[[str], None]) -> Callable[[], None] | None:
        """What runs once every unit is done, before the output is marked complete."""
        ...

    def changes(self) -> PreviousCounts | None:
        """What the summary counts against a previous output."""
        ...

    def finish(self, summary: Summary) -> None:
        """Keep the run's summary where the mode's output needs it besides the run's own."""
        ...


class Mode:
    """The answers of a mode that carries nothing over and ends with nothing: a base for
    modes to derive from. `mine` is the run's `--shard` share, once opened."""

    mine: Collection[str] | None = None

    def pending(self, done: Collection[str]) -> PendingUnits:
        return PendingUnits(done, self.mine)

    def describe(self) -> str:
        return ""

    def carrier(self) -> CarryOver:
        return CarryOver(None)

    def sizes(self) -> VectorSizes | None:
        return None

    def upserts(self) -> UpsertSinks:
        return no_upserts

    def end(self, phase: Callable[[str], None]) -> Callable[[], None] | None:
        return None

    def changes(self) -> PreviousCounts | None:
        return None

    def finish(self, summary: Summary) -> None:
        return None


# What a mode reads once its run directory is open: given the fingerprint, the done units
# and whether the output is complete, whether it is complete now.
Start = Callable[[dict[str, Any], dict[str, "UnitRecord"], bool], bool]


@contextlib.contextmanager
def own_output(plan: RunPlan) -> Iterator[tuple[RunDirectory, Sink]]:
    """The run directory and sink of the `--output` of `plan`; a stream's bookkeeping is a
    temporary directory of its own, removed on the way out."""
    config = plan.config
    run = RunDirectory.for_target(plan.target, config.run.shard, config.run.break_lock)
    settings = SinkSettings.of(config, plan.spec.normalize, Intents(run.meta))
    try:
        yield run, make_sink(plan.target, settings)
    finally:
        if plan.target.run_directory is None and isinstance(run.meta, Path):
            remove_scratch(run.meta)


@contextlib.contextmanager
def opened_directory(
    plan: RunPlan, run: RunDirectory, sink: Sink, reporter: Reporter, start: Start
) -> Iterator[OpenedRun]:
    """Open `run` (lock, fingerprint, ledger mended against `sink`) to run `plan`, let the
    mode `start`, and write the configuration. An error on the way (but an interrupt) is
    recorded for `bulkembed status`; the lock drops on the way out."""
    config = plan.config
    resumable = plan.target.capabilities.resumable
    settings = fingerprint(config, plan.spec, list(plan.files))
    done = run.open(settings, config.run.overwrite, sink, plan.my_units)
    for repair in run.repairs:
        reporter.warn(repair)
    try:
        run.clear_failure()
        earlier = change_set_of(plan.target, run.meta) if config.run.overwrite else None
        if earlier is not None:
            # What an earlier `--since` run wrote beside the output goes with it.
            earlier.remove()
        complete = start(settings, done, run.is_complete())
        _write_config(plan, run, settings)
        if complete:
            reporter.info(f"nothing to do: {plan.target.label} already holds every document")
        yield OpenedRun(plan, run, sink, done, complete)
    except Exception as e:
        if resumable and not isinstance(e, (Interrupted, OutputLocked)):
            # Where the record cannot be written either (the full disk that ended the run),
            # `status` says stopped, and the run's own error is what the caller sees.
            with contextlib.suppress(OSError, BulkembedError):
                run.record_failure(exit_status(e), one_line(e))
        raise
    finally:
        if not resumable:
            _report_bad_records(run, reporter)
        run.release_lock()


def _write_config(plan: RunPlan, run: RunDirectory, settings: dict[str, Any]) -> None:
    """`config.json`: the fingerprint, the inputs, the model and the settings its vectors
    were made with (`recorded`); `vocab.json` for sparse outputs."""
    spec_fields = {k: v for k, v in asdict(plan.spec).items() if k != "tokenizer_json"}
    paths = [{"name": f.name, "path": str(f.path)} for f in plan.files]
    run.write_config(
        {
            "version": __version__,
            "fingerprint": settings,
            "input_paths": paths,
            "model": spec_fields,
            "encoder": encoder_record(plan.spec, plan.output_format),
            "records_per_unit": plan.config.inputs.records_per_unit,
            **plan.run_info(),
        }
    )
    if "sparse" in plan.spec.outputs:
        _write_vocabulary(run, plan)


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

"""A run mode added in one file: a dry run that lists the units still to embed and writes
nothing. It derives from `Mode`, is set on the plan, and runs through `run_plan` like the
built-in modes; nothing in `config.py`, `cli/` or `engine/` names it."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from helpers import run_cli, sample_texts, write_jsonl

from bulkembed import RunConfig
from bulkembed.batching.units import counted_units
from bulkembed.engine.modes import Mode, OpenedRun
from bulkembed.engine.plan import RunPlan, plan_run
from bulkembed.engine.run import run_plan
from bulkembed.reporting.progress import QuietReporter, Reporter
from bulkembed.run_dir import RunDirectory
from bulkembed.sinks import sink_of


class ListPending(Mode):
    """Lists the units a run of the plan would embed; writes nothing, loads no model."""

    def __init__(self) -> None:
        self.listed: list[str] = []

    @contextlib.contextmanager
    def open(self, plan: RunPlan, reporter: Reporter) -> Iterator[OpenedRun]:
        run = RunDirectory.for_target(plan.target, plan.config.run.shard)
        done = run.done_units()
        self.mine = plan.my_units
        pending = self.pending(done)
        units = counted_units(list(plan.files), plan.config.inputs.records_per_unit)
        self.listed = [unit for unit in units if unit in pending]
        for unit in self.listed:
            reporter.info(f"pending: {unit}")
        yield OpenedRun(plan, run, sink_of(plan.target), done, complete=True)


class Lines(QuietReporter):
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, message: str) -> None:
        self.lines.append(message)


def _dry_run(corpus: Path, model: Path, out: Path) -> tuple[ListPending, Lines]:
    config = RunConfig(
        inputs=(str(corpus),),
        output=str(out),
        model=str(model),
        dtype="float32",
        tokenize_workers=0,
        records_per_unit=10,
    )
    reporter = Lines()
    mode = ListPending()
    plan = replace(plan_run(config, reporter, time.monotonic()), mode=mode)
    run_plan(plan, reporter)
    return mode, reporter


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_a_dry_run_lists_the_units_a_run_would_embed_and_writes_nothing(tmp_path, tiny_st):
    model = tiny_st("mean")
    texts = sample_texts(55)
    corpus, out = tmp_path / "corpus", tmp_path / "out"
    write_jsonl(corpus / "a.jsonl", [{"id": f"a{i}", "text": t} for i, t in enumerate(texts[:30])])

    mode, reporter = _dry_run(corpus, model, out)
    assert mode.listed == ["part-00000-000000", "part-00000-000001", "part-00000-000002"]
    assert reporter.lines == [f"pending: {unit}" for unit in mode.listed]
    assert not out.exists()

    ran = run_cli(corpus, model, out, "--dtype", "float32", "--records-per-unit", "10")
    assert ran.exit_code == 0, ran.output
    write_jsonl(corpus / "b.jsonl", [{"id": f"b{i}", "text": t} for i, t in enumerate(texts[30:])])
    before = _files(out)

    mode, _ = _dry_run(corpus, model, out)
    assert mode.listed == ["part-00001-000000", "part-00001-000001", "part-00001-000002"]
    assert _files(out) == before

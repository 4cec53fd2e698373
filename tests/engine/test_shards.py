"""`--shard I/N`: N runs side by side into one output write what one run writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import (
    ROOT,
    cosines,
    read_output,
    run_arguments,
    sample_texts,
    write_jsonl,
    write_parquet,
)
from typer.testing import CliRunner

from bulkembed.cli import app

pytestmark = pytest.mark.slow


# Records per JSONL unit: a JSONL file of 500 lines is two units.
UNIT = ("--records-per-unit", "400")


def _corpus(folder):
    """Nine units: two JSONL files of 500 lines (two units each), a Parquet file of five
    row groups; integer-like ids given as strings, so no id repeats."""
    texts = sample_texts(500)
    for n in range(2):
        records = [{"id": f"j{n}-{i}", "text": texts[i % 500][:80]} for i in range(500)]
        write_jsonl(folder / f"lines-{n}.jsonl", records)
    records = [{"id": f"p{i}", "text": texts[(7 * i) % 500][:80]} for i in range(100)]
    write_parquet(folder / "table.parquet", records, row_group_size=20)
    return folder


def _command(corpus, model, out, *extra):
    arguments = run_arguments(corpus, model, out, "-q", *UNIT, *extra)
    return [sys.executable, "-m", "bulkembed", *arguments]


def test_three_shards_side_by_side_write_what_one_run_writes(tmp_path, tiny_st):
    corpus = _corpus(tmp_path / "corpus")
    model = tiny_st("mean")
    whole = subprocess.run(_command(corpus, model, tmp_path / "whole"), capture_output=True)
    assert whole.returncode == 0, whole.stderr.decode()

    out = tmp_path / "sharded"
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    runs = [
        subprocess.Popen(
            _command(corpus, model, out, "--shard", f"{i}/3"),
            stderr=subprocess.PIPE,
            env=environment,
        )
        for i in range(3)
    ]
    for run in runs:
        assert run.wait() == 0, run.stderr.read().decode()

    expected, got = read_output(tmp_path / "whole"), read_output(out)
    assert sorted(got) == sorted(expected) and len(got) == 1100
    ids = sorted(expected)
    assert cosines([got[i] for i in ids], [expected[i] for i in ids]).min() >= 0.99999
    parts = sorted(p.name for p in out.glob("*.parquet"))
    assert parts == sorted(p.name for p in (tmp_path / "whole").glob("*.parquet"))
    assert len(parts) == 9
    assert (out / "_bulkembed" / "complete").exists()
    status = CliRunner().invoke(app, ["status", str(out), "--json"])
    figures = json.loads(status.output)
    assert (figures["state"], figures["units_done"], figures["units_pending"]) == ("complete", 9, 0)
    assert figures["docs"] == 1100


def test_a_shard_takes_every_nth_unit_and_leaves_the_output_incomplete(tmp_path, tiny_st):
    corpus = _corpus(tmp_path / "corpus")
    out = tmp_path / "out"
    args = ["run", str(corpus), "--model", str(tiny_st("mean")), "--output", str(out)]
    result = CliRunner().invoke(app, [*args, "--tokenize-workers", "0", *UNIT, "--shard", "1/3"])
    assert result.exit_code == 0, result.output
    assert "shard 1/3 is done; 6 units of other shards are pending" in result.output
    # Units in input order: lines-0 (0, 1), lines-1 (2, 3), table (4 to 8); 1/3 takes 1, 4, 7.
    parts = sorted(p.stem for p in out.glob("*.parquet"))
    assert parts == ["part-00000-000001", "part-00002-000000", "part-00002-000003"]
    assert not (out / "_bulkembed" / "complete").exists()
    status = json.loads(CliRunner().invoke(app, ["status", str(out), "--json"]).output)
    assert (status["units_done"], status["units_pending"]) == (3, 6)
    assert status["state"] == "stopped"
    summary = json.loads((out / "_bulkembed" / "summary.json").read_text())
    assert (summary["shard"], summary["docs"]) == ("1/3", 100 + 20 + 20)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--shard", "3/3"], "--shard 3/3: expected I/N with 0 <= I < N"),
        (["--shard", "1-3"], "--shard 1-3: expected I/N"),
        (["--shard", "0/2", "--limit", "5"], "--shard cannot be combined with --limit"),
        (["--shard", "0/2", "--overwrite"], "--shard cannot be combined with --overwrite"),
        (["--shard", "0/2", "--output", "-"], "--shard writes from several processes"),
    ],
)
def test_shard_options_that_cannot_work_are_refused(tmp_path, tiny_st, extra, message):
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": "a"}])
    args = ["run", str(corpus), "--model", str(tiny_st("mean")), "--output", str(tmp_path / "o")]
    result = CliRunner().invoke(app, [*args, *extra])
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_a_shard_that_finds_another_shard_s_table_between_its_looks_goes_on(tmp_path):
    """Shard 0 claims the output and makes its table between shard 1's look for a claim
    and its look for foreign data: the claim, made first, shows the table is bulkembed's.
    Without another shard's claim, or without --shard, foreign data is refused."""
    from bulkembed.config import ShardSpec
    from bulkembed.errors import OutputError
    from bulkembed.run_dir import RunDirectory
    from bulkembed.sinks.parquet import ParquetSink

    class RacedSink(ParquetSink):
        """Another shard claims the output while this one looks for foreign data."""

        def __init__(self, directory, claimed):
            super().__init__(directory)
            self.claimed = claimed

        def check_foreign(self, overwrite):
            if self.claimed:
                config = self.directory / "_bulkembed" / "config.json"
                config.parent.mkdir(parents=True, exist_ok=True)
                config.write_text(json.dumps({"fingerprint": {"max_length": 256}, "run": "r"}))
            raise OutputError("holds a table 't' that bulkembed did not write")

    def open_run(name, shard, claimed):
        output = tmp_path / name
        run = RunDirectory(output, shard=shard)
        run.open({"max_length": 256}, False, RacedSink(output, claimed), mine=())
        run.release_lock()

    open_run("a", ShardSpec(1, 3), claimed=True)
    for name, shard, claimed in (("b", ShardSpec(1, 3), False), ("c", None, True)):
        with pytest.raises(OutputError, match="did not write"):
            open_run(name, shard, claimed)


def test_the_first_shard_fixes_the_settings_and_n_for_the_others(tmp_path):
    from bulkembed.config import ShardSpec
    from bulkembed.errors import OutputError
    from bulkembed.run_dir import RunDirectory
    from bulkembed.sinks.parquet import ParquetSink

    def open_shard(index, count, fingerprint):
        run = RunDirectory(tmp_path, shard=ShardSpec(index, count))
        run.open(fingerprint, False, ParquetSink(tmp_path), mine=())
        return run

    first = open_shard(0, 3, {"max_length": 256})
    with pytest.raises(OutputError, match=r"other settings \(--max-length: 256 -> 128\)"):
        open_shard(1, 3, {"max_length": 128})
    with pytest.raises(
        OutputError, match="shared out among runs with --shard I/3: pass the same N"
    ):
        open_shard(1, 2, {"max_length": 256})
    second = open_shard(1, 3, {"max_length": 256})
    assert json.loads((tmp_path / "_bulkembed" / "shards.json").read_text()) == {"count": 3}
    assert not list((tmp_path / "_bulkembed").glob(".*.tmp"))
    first.release_lock()
    second.release_lock()

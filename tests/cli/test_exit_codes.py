"""The exit-status contract of `bulkembed run`, and the states `bulkembed status` reports."""

from __future__ import annotations

import json
import os
import socket

import pyarrow.parquet as pq
import pytest
from helpers import (
    fail_at_commit,
    fill_the_disk_at_commit,
    records,
    run_cli,
    status_of,
    write_jsonl,
)
from typer.testing import CliRunner

from bulkembed.cli import app
from bulkembed.errors import (
    BulkembedError,
    ExitCode,
    Interrupted,
    OutputLocked,
    TooManyBadRecords,
    TooManyDeletes,
    UsageError,
    exit_status,
)
from bulkembed.run_dir import LockedError, RunDirectory

FLOAT32 = ("--dtype", "float32", "--max-batch-tokens", "512", "--records-per-unit", "10")


def _corpus_with_bad_lines(tmp_path, good: int = 20):
    """`good` records, then two lines that are not JSON (lines good + 1 and good + 2)."""
    corpus = write_jsonl(tmp_path / "c.jsonl", records(good))
    with open(corpus, "a", encoding="utf-8") as f:
        f.write("not json\n{broken\n")
    return corpus


def test_the_codes_are_the_documented_ones():
    assert [int(c) for c in ExitCode] == [0, 1, 2, 3, 4, 75, 130, 143, 141]
    assert exit_status(UsageError("x")) == 2 and exit_status(BulkembedError("x")) == 1
    assert exit_status(LockedError("x")) == 75 and isinstance(LockedError("x"), OutputLocked)
    assert exit_status(TooManyBadRecords("x")) == 3 and exit_status(ValueError("x")) == 1
    assert exit_status(TooManyDeletes("x")) == 4
    assert (exit_status(Interrupted(2, "x")), exit_status(Interrupted(15, "x"))) == (130, 143)


def test_a_usage_error_exits_2_and_a_failed_run_1(tmp_path, tiny_st):
    corpus = write_jsonl(tmp_path / "c.jsonl", records(20))
    conflict = run_cli(
        corpus, tiny_st("mean"), tmp_path / "a", "--quantize", "int8", "--dtype-out", "float16"
    )
    assert conflict.exit_code == 2
    assert conflict.stderr == (
        "error: --quantize int8 and --dtype-out float16 conflict: quantized vectors are "
        "integers; pass one of them\n"
    )
    missing = run_cli(tmp_path / "nowhere.jsonl", tiny_st("mean"), tmp_path / "b")
    assert (missing.exit_code, missing.stderr) == (
        2,
        f"error: input not found: {tmp_path}/nowhere.jsonl\n",
    )
    # Click's own usage errors share the code.
    assert CliRunner().invoke(app, ["run", str(corpus), "--model", "m"]).exit_code == 2

    out = tmp_path / "out"
    with pytest.MonkeyPatch.context() as patched:
        fill_the_disk_at_commit(patched, 2)
        failed = run_cli(corpus, tiny_st("mean"), out, *FLOAT32)
    assert failed.exit_code == 1 and "No space left on device" in failed.stderr
    status = status_of(out)
    assert (status["state"], status["units_done"], status["units_pending"]) == ("failed", 1, 1)
    assert status["message"].startswith("failed with exit status 1: cannot commit ")
    assert status["message"].endswith("; run the same command to resume")
    assert json.loads((out / "_bulkembed" / "failed.json").read_text())["exit_code"] == 1
    resumed = run_cli(corpus, tiny_st("mean"), out, *FLOAT32)
    assert resumed.exit_code == 0, resumed.output
    assert (
        status_of(out)["state"] == "complete" and not (out / "_bulkembed" / "failed.json").exists()
    )


@pytest.mark.parametrize(
    ("limit", "code", "message"),
    [
        (None, 0, ""),
        ("2", 0, ""),
        ("0.1", 0, ""),
        (
            "1",
            3,
            "error: 2 bad records, over --max-bad-records 1; the run finished and committed "
            "the rest\n",
        ),
        (
            "0.05",
            3,
            "error: 2 bad records, over --max-bad-records 0.05 of 22 records read; the run "
            "finished and committed the rest\n",
        ),
    ],
)
def test_bad_records_over_the_limit_exit_3_after_committing_everything(
    tmp_path, tiny_st, limit, code, message
):
    corpus = _corpus_with_bad_lines(tmp_path)
    out = tmp_path / "out"
    extra = () if limit is None else ("--max-bad-records", limit)
    result = run_cli(corpus, tiny_st("mean"), out, *FLOAT32, *extra)
    assert result.exit_code == code, result.output
    assert result.stderr == message
    assert pq.read_table(out).num_rows == 20
    status = status_of(out)
    assert (status["state"], status["bad_records"]) == ("complete", 2)


def test_python_callers_get_the_summary_with_the_error(tmp_path, tiny_st):
    from bulkembed import embed_corpus
    from bulkembed.config import RunConfig

    corpus = _corpus_with_bad_lines(tmp_path, good=12)
    config = RunConfig(
        inputs=(str(corpus),),
        output=str(tmp_path / "out"),
        model=str(tiny_st("mean")),
        dtype="float32",
        tokenize_workers=0,
        max_bad_records=0.1,
    )
    with pytest.raises(
        TooManyBadRecords, match="^2 bad records, over --max-bad-records 0.1 of 14 "
    ) as e:
        embed_corpus(config)
    assert (e.value.summary.docs, e.value.summary.bad_records) == (12, 2)


def test_the_bad_record_limit_is_checked(tmp_path, tiny_st):
    corpus = _corpus_with_bad_lines(tmp_path)
    for value in ("1.5", "-1", "many"):
        result = run_cli(corpus, tiny_st("mean"), tmp_path / "out", "--max-bad-records", value)
        assert result.exit_code == 2
        assert result.stderr == (
            f"error: --max-bad-records {value}: give a count (25) or a fraction of the records "
            "read below 1 (0.01)\n"
        )


def test_an_output_in_use_exits_75_and_status_says_running(tmp_path, tiny_st):
    corpus = write_jsonl(tmp_path / "c.jsonl", records(20))
    out = tmp_path / "out"
    assert status_of(out) == {
        "output": str(out),
        "state": "missing",
        "message": f"{out} does not exist: check the path, or run bulkembed run",
    }
    assert run_cli(corpus, tiny_st("mean"), out, *FLOAT32, "--limit", "5").exit_code == 0
    (out / "_bulkembed" / "complete").unlink()
    assert (status_of(out)["state"], status_of(out)["message"]) == (
        "stopped",
        "unfinished: run the same command to resume",
    )
    table = CliRunner().invoke(app, ["status", str(out)]).stdout
    assert "state │ stopped" in " ".join(table.split())
    assert table.splitlines()[-1] == "unfinished: run the same command to resume"
    holder = RunDirectory(out)
    holder.acquire_lock()
    try:
        status = status_of(out)
        expected = f"pid {os.getpid()} on {socket.gethostname()}"
        assert (status["state"], status["message"]) == ("running", f"running ({expected})")
        result = run_cli(corpus, tiny_st("mean"), out, *FLOAT32, "--limit", "5")
        assert result.exit_code == 75
        assert result.stderr.startswith(
            f"error: {out} is in use by a running bulkembed ({expected}"
        )
    finally:
        holder.release_lock()
    assert status_of(out)["state"] == "stopped"


def test_status_of_an_interrupted_run_is_stopped(tmp_path, tiny_st, monkeypatch):
    corpus = write_jsonl(tmp_path / "c.jsonl", records(20))
    out = tmp_path / "out"
    fail_at_commit(monkeypatch, 2, Interrupted(15, "stopped by SIGTERM"))
    result = run_cli(corpus, tiny_st("mean"), out, *FLOAT32)
    assert (result.exit_code, result.stderr) == (143, "error: stopped by SIGTERM\n")
    status = status_of(out)
    assert (status["state"], status["units_done"]) == ("stopped", 1)
    assert not (out / "_bulkembed" / "failed.json").exists()

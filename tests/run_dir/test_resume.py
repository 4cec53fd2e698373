"""Resume, the ledger, the lock, settings checks and full-disk failures."""

import json
import multiprocessing
import os
import socket

import numpy as np
import pytest
from helpers import (
    fill_the_disk_at_commit,
    read_output,
    records,
    run_cli,
    write_corpus,
    write_jsonl,
)
from typer.testing import CliRunner

from bulkembed.cli import app
from bulkembed.run_dir import RunDirectory

runner = CliRunner()


def _corpus(tmp_path, n=150, row_group_size=10):
    """`n` records: half in a Parquet file, half in a JSONL file."""
    texts = records(n)
    return write_corpus(tmp_path, texts, n // 2, row_group_size), texts


def _summary(out):
    return json.loads((out / "_bulkembed" / "summary.json").read_text())


def test_second_run_of_a_finished_job_does_no_model_work(tmp_path, tiny_st, monkeypatch):
    corpus, records = _corpus(tmp_path)
    out = tmp_path / "out"
    assert run_cli(corpus, tiny_st("mean"), out).exit_code == 0
    first = read_output(out)
    summary = _summary(out)

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded for a finished run")

    monkeypatch.setattr("bulkembed.encoders.build_encoder", no_model)
    again = runner.invoke(
        app, ["run", str(corpus), "--model", str(tiny_st("mean")), "--output", str(out)]
    )
    assert again.exit_code == 0, again.output
    assert "nothing to do" in again.stderr
    assert _summary(out) == summary and summary["docs"] == 150
    assert read_output(out) == first


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (["--max-length", "32"], "--max-length: 64 -> 32"),
        (["--pooling", "cls"], "--pooling: 'mean' -> 'cls'"),
        (["--text-column", "id"], "--text-column: 'text' -> 'id'"),
    ],
)
def test_changed_settings_are_refused_naming_the_setting(tmp_path, tiny_st, change, message):
    corpus, _ = _corpus(tmp_path, 20)
    out = tmp_path / "out"
    assert run_cli(corpus, tiny_st("mean"), out).exit_code == 0
    result = run_cli(corpus, tiny_st("mean"), out, *change)
    assert result.exit_code == 1
    line = result.stderr.strip()
    assert message in line and "pass --overwrite to start over" in line
    assert len(line.splitlines()) == 1


def test_another_model_is_refused(tmp_path, tiny_st):
    corpus, _ = _corpus(tmp_path, 20)
    out = tmp_path / "out"
    assert run_cli(corpus, tiny_st("mean"), out).exit_code == 0
    result = run_cli(corpus, tiny_st("cls"), out)
    assert result.exit_code == 1
    assert "--model: " in result.stderr and "tiny-st-cls" in result.stderr


def test_changed_input_is_refused(tmp_path, tiny_st):
    corpus, _ = _corpus(tmp_path, 20)
    out = tmp_path / "out"
    assert run_cli(corpus, tiny_st("mean"), out).exit_code == 0
    with open(corpus / "b.jsonl", "a") as f:
        f.write('{"id": "new", "text": "added later"}\n')
    result = run_cli(corpus, tiny_st("mean"), out)
    assert result.exit_code == 1 and "the inputs (files added, removed or changed" in result.stderr


def _edit_in_place(path):
    """Change one character of a file, keeping its size, and move its time on."""
    data = path.read_bytes()
    at = data.index(b"the")
    path.write_bytes(data[:at] + b"THE" + data[at + 3 :])
    status = path.stat()
    os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns + 1_000_000_000))


def test_an_input_edited_in_place_with_the_same_size_is_refused(tmp_path, tiny_st):
    corpus, _ = _corpus(tmp_path, 20)
    out = tmp_path / "out"
    assert run_cli(corpus, tiny_st("mean"), out).exit_code == 0
    (out / "_bulkembed" / "complete").unlink()
    (out / "_bulkembed" / "done" / "part-00001-000000.json").unlink()
    _edit_in_place(corpus / "b.jsonl")
    result = run_cli(corpus, tiny_st("mean"), out)
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        f"error: {out} holds a run with other settings (the inputs (b.jsonl was modified "
        "after the output was started; a run started with --verify-inputs compares contents "
        "instead of times)): pass --overwrite to start over, or choose another --output"
    )


def test_verify_inputs_compares_contents_instead_of_times(tmp_path, tiny_st):
    corpus, _ = _corpus(tmp_path, 20)
    out = tmp_path / "out"
    assert run_cli(corpus, tiny_st("mean"), out, "--verify-inputs").exit_code == 0
    inputs = json.loads((out / "_bulkembed" / "config.json").read_text())["fingerprint"]["inputs"]
    assert [len(i["content"]) for i in inputs] == [32, 32]
    status = (corpus / "b.jsonl").stat()
    os.utime(corpus / "b.jsonl", ns=(status.st_atime_ns, status.st_mtime_ns + 10**9))
    touched = run_cli(corpus, tiny_st("mean"), out, "--verify-inputs")
    assert touched.exit_code == 0, touched.output
    _edit_in_place(corpus / "b.jsonl")
    edited = run_cli(corpus, tiny_st("mean"), out, "--verify-inputs")
    assert edited.exit_code == 1
    assert "the inputs (b.jsonl changed in content)" in edited.stderr


def _hold_lock(output, ready, release):
    run = RunDirectory(output)
    run.meta.mkdir(parents=True, exist_ok=True)
    run.acquire_lock()
    ready.set()
    release.wait(30)


def _start_lock_holder(out):
    """A process that takes the output's lock and keeps it until `release` is set."""
    context = multiprocessing.get_context("spawn")
    ready, release = context.Event(), context.Event()
    holder = context.Process(target=_hold_lock, args=(out, ready, release))
    holder.start()
    assert ready.wait(30)
    return holder, release


def test_a_second_run_is_refused_while_the_first_holds_the_lock(tmp_path, tiny_st):
    corpus, _ = _corpus(tmp_path, 20)
    out = tmp_path / "out"
    holder, release = _start_lock_holder(out)
    try:
        result = run_cli(corpus, tiny_st("mean"), out)
        assert result.exit_code == 75
        assert f"is in use by a running bulkembed (pid {holder.pid} on " in result.stderr
        assert RunDirectory(out).lock_holder().startswith(f"pid {holder.pid} on ")
    finally:
        release.set()
        holder.join()
    assert RunDirectory(out).lock_holder() is None
    assert run_cli(corpus, tiny_st("mean"), out).exit_code == 0


def test_the_lock_of_a_killed_run_is_taken_over(tmp_path, tiny_st):
    corpus, _ = _corpus(tmp_path, 20)
    out = tmp_path / "out"
    holder, _ = _start_lock_holder(out)
    assert RunDirectory(out).lock_holder() == f"pid {holder.pid} on {socket.gethostname()}"
    holder.kill()
    holder.join()
    assert (out / "_bulkembed" / "lock").read_text().startswith(f"pid {holder.pid} ")
    assert RunDirectory(out).lock_holder() is None
    assert run_cli(corpus, tiny_st("mean"), out).exit_code == 0
    assert len(read_output(out)) == 20


def test_full_disk_fails_cleanly_and_the_rerun_completes(tmp_path, tiny_st, monkeypatch):

    corpus, records = _corpus(tmp_path, 120)
    model = tiny_st("mean")
    assert run_cli(corpus, model, tmp_path / "reference").exit_code == 0
    reference = read_output(tmp_path / "reference")

    out = tmp_path / "out"
    with monkeypatch.context() as patched:
        fill_the_disk_at_commit(patched, 4)
        result = run_cli(corpus, model, out)
    assert result.exit_code == 1
    [line] = result.stderr.splitlines()
    assert line.startswith("error: cannot commit ") and "No space left on device" in line
    committed = sorted(p.name for p in out.glob("*.parquet"))
    assert committed == [f"part-00000-{u:06d}.parquet" for u in range(3)]
    assert not list(out.glob(".*.tmp")) and RunDirectory(out).lock_holder() is None

    assert run_cli(corpus, model, out).exit_code == 0
    resumed = read_output(out)
    assert resumed.keys() == reference.keys() == {r["id"] for r in records}
    for key, vector in reference.items():
        assert np.dot(vector, resumed[key]) >= 0.9999


def test_status_reports_done_and_pending_units(tmp_path, tiny_st):
    corpus, _ = _corpus(tmp_path, 60)
    out = tmp_path / "out"
    assert run_cli(corpus, tiny_st("mean"), out, "--limit", "25").exit_code == 0
    result = runner.invoke(app, ["status", str(out)])
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    assert "state │ complete" in text and "units done │ 3" in text and "docs │ 25" in text
    assert "units pending │ 0" in text and "lock │ -" in text

    missing = runner.invoke(app, ["status", str(tmp_path / "nothing")])
    assert missing.exit_code == 66
    assert "state │ missing" in " ".join(missing.stdout.split())
    (tmp_path / "empty").mkdir()
    empty = runner.invoke(app, ["status", str(tmp_path / "empty"), "--json"])
    assert empty.exit_code == 66 and json.loads(empty.stdout)["state"] == "not-started"


def test_naming_the_default_id_column_is_the_same_setting(tmp_path, tiny_st):
    corpus = write_jsonl(
        tmp_path / "c.jsonl", [{"id": "a", "text": "one"}, {"id": "b", "text": "two"}]
    )
    out = tmp_path / "out"
    assert run_cli(corpus, tiny_st("mean"), out).exit_code == 0
    again = run_cli(corpus, tiny_st("mean"), out, "--id-column", "id")
    assert again.exit_code == 0, again.output
    other = run_cli(corpus, tiny_st("mean"), out, "--id-column", "text")
    assert other.exit_code == 1
    assert "(--id-column: 'id' -> 'text')" in other.stderr

"""Parquet outputs on object storage (a real S3 server on 127.0.0.1): the same output as on
a local disk, exactly once after crashes, shards side by side, one run at a time by a
lease, and one-line errors for a store that cannot be used."""

from __future__ import annotations

import errno
import json
import os
import random
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fault_harness import run_forked
from helpers import (
    ROOT,
    fail_at_commit,
    read_output,
    records,
    run_cli,
    sample_texts,
    status_of,
    write_jsonl,
    write_mixed_corpus,
)

from bulkembed import storage
from bulkembed.config import ShardSpec
from bulkembed.errors import OutputError
from bulkembed.run_dir import LockedError, RunDirectory
from bulkembed.run_dir import lease as lease_module
from bulkembed.run_dir.lease import LeaseLost, ObjectLease
from bulkembed.storage import location
from bulkembed.storage import s3 as storage_s3

FLOAT32 = ("--dtype", "float32", "--max-batch-tokens", "256")


def _corpus(folder, n=300, row_group_size=20):
    records = [{"id": f"doc-{i}", "text": t} for i, t in enumerate(sample_texts(n))]
    for record in records[5:n:11]:
        record["text"] = None
    return write_mixed_corpus(folder, records, n // 2, row_group_size=row_group_size)


def _table(uri):
    """Every part of an output on S3 as one table, sorted by id (the run directory's
    files start with '_' and are not parts)."""
    path = location(uri)
    assert isinstance(path, storage.ObjectPath)
    table = pq.read_table(path.key, filesystem=path.fs)
    ids = table.column("id").to_pylist()
    assert len(ids) == len(set(ids)), "an id appears more than once in the output"
    return table.sort_by("id")


def _assert_same_rows(got, expected):
    """The same ids and texts, each once, and the same vectors up to float32 rounding (runs
    on another number of threads sum in another order)."""
    assert got.column("id").equals(expected.column("id"))
    assert got.column("content_hash").equals(expected.column("content_hash"))
    a = np.array(got.column("dense").to_pylist())
    b = np.array(expected.column("dense").to_pylist())
    assert np.abs(a - b).max() < 1e-5


def _status(out):
    return status_of(out)


def test_an_output_on_s3_equals_the_same_run_on_a_local_disk(tmp_path, s3, tiny_st):
    corpus = _corpus(tmp_path / "corpus")
    model = tiny_st("mean")
    local = tmp_path / "local"
    assert run_cli(corpus, model, local, *FLOAT32).exit_code == 0
    out = s3.uri("runs/out")
    result = run_cli(corpus, model, out, *FLOAT32)
    assert result.exit_code == 0, result.output

    expected = pq.read_table(sorted(local.glob("*.parquet"))).sort_by("id")
    got = _table(out)
    assert got.num_rows == 273
    assert got.schema.remove_metadata() == expected.schema.remove_metadata()
    assert got.equals(expected)
    parts = sorted(p.name for p in local.glob("*.parquet"))
    assert [k for k in s3.keys("runs/out/") if k.endswith(".parquet")] == [
        f"runs/out/{p}" for p in parts
    ]
    figures = _status(out)
    assert (figures["state"], figures["units_pending"], figures["docs"]) == ("complete", 0, 273)
    assert figures["lock"] is None
    bad = location(out) / "_bulkembed" / "bad_records.jsonl"
    assert len(bad.read_text().splitlines()) == 27
    assert "lease" not in " ".join(s3.keys("runs/out/_bulkembed/"))
    again = run_cli(corpus, model, out, *FLOAT32)
    assert "already holds every document" in again.output or again.exit_code == 0


def test_status_of_a_half_done_run_on_s3(tmp_path, s3, tiny_st):
    corpus = _corpus(tmp_path / "corpus", n=100)
    out = s3.uri("half")
    done = run_cli(corpus, tiny_st("mean"), out, *FLOAT32, "--shard", "0/2")
    assert done.exit_code == 0, done.output
    figures = _status(out)
    assert figures["state"] == "stopped"
    assert figures["units_done"] > 0 and figures["units_pending"] > 0
    assert figures["units_done"] + figures["units_pending"] == len(
        [u for u in range(figures["units_done"] + figures["units_pending"])]
    )


@pytest.mark.slow
def test_sigkill_at_5_points_on_s3_then_rerun_gives_every_id_once(tmp_path, s3, tiny_st):
    corpus = _corpus(tmp_path / "corpus", n=200, row_group_size=5)
    model = tiny_st("mean")
    reference = tmp_path / "reference"
    assert run_cli(corpus, model, reference, *FLOAT32, workers=1).exit_code == 0
    expected = pq.read_table(sorted(reference.glob("*.parquet"))).sort_by("id")

    out = s3.uri("killed")
    arguments = ["run", str(corpus), "--model", str(model), "--output", out, "--quiet"]
    arguments += [*FLOAT32, "--tokenize-workers", "1"]
    rng = random.Random(20261125)
    stages = ["write", "commit", "marked", "encode", "tokenize"]
    for stage in stages:
        killed = run_forked(stage, rng.randint(2, 6), "SIGKILL", arguments)
        assert killed.returncode == -9, (stage, killed.stderr[-2000:])
        # The dead run's lease is left behind, naming a process of this machine that is
        # gone: the next run takes it over.
        assert "lease" in s3.keys("killed/_bulkembed/")[-1]
    assert 0 < len(RunDirectory(location(out)).done_units()) < 44
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    final = subprocess.run(
        [sys.executable, "-m", "bulkembed", *arguments],
        capture_output=True,
        text=True,
        timeout=300,
        env=environment,
    )
    assert final.returncode == 0, final.stderr
    _assert_same_rows(_table(out), expected)
    parts = sorted(f"killed/{p.name}" for p in reference.glob("*.parquet"))
    others = sorted(k for k in s3.keys("killed/") if not k.startswith("killed/_bulkembed/"))
    assert others == parts  # no orphan object under the output prefix
    assert not [k for k in s3.keys("killed/_bulkembed/") if k.endswith(".tmp")]


@pytest.mark.slow
def test_three_shards_write_one_s3_output_together(tmp_path, s3, tiny_st):
    corpus = _corpus(tmp_path / "corpus", n=200, row_group_size=25)
    model = tiny_st("mean")
    whole = tmp_path / "whole"
    assert run_cli(corpus, model, whole, *FLOAT32).exit_code == 0
    out = s3.uri("sharded")
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "bulkembed", "run", str(corpus), "--model", str(model)]
    command += ["--output", out, "--quiet", "--tokenize-workers", "0", *FLOAT32]
    runs = [
        subprocess.Popen([*command, "--shard", f"{i}/3"], stderr=subprocess.PIPE, env=environment)
        for i in range(3)
    ]
    for run in runs:
        assert run.wait(timeout=300) == 0, run.stderr.read().decode()
    expected = pq.read_table(sorted(whole.glob("*.parquet"))).sort_by("id")
    _assert_same_rows(_table(out), expected)
    keys = s3.keys("sharded/_bulkembed/")
    assert "sharded/_bulkembed/complete" in keys
    assert not [k for k in keys if "lease" in k]
    assert _status(out)["state"] == "complete"


def test_a_second_run_on_the_same_s3_output_is_refused_while_the_lease_lives(
    tmp_path, s3, tiny_st, monkeypatch
):
    # Long enough that the holder's renewals (every 2.5 s, on a thread of this process) keep
    # it alive while the refused run starts in this process on a loaded machine.
    monkeypatch.setenv("BULKEMBED_LEASE_SECONDS", "10")
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"id": "a", "text": "one text"}])
    out = s3.uri("busy")
    meta = location(out) / "_bulkembed"
    holder = ObjectLease(meta, out, None)
    holder.acquire()
    try:
        result = run_cli(corpus, tiny_st("mean"), out)
        assert result.exit_code == 75
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert len(lines) == 1, result.output
        assert f"{out} is in use by a running bulkembed (pid {os.getpid()}" in lines[0]
        assert "--break-lock" in lines[0] and "Traceback" not in result.output
        assert not [k for k in s3.keys("busy/") if k.endswith(".parquet")]
        assert RunDirectory(location(out)).lock_holder() == holder.holder_name
        shard = ObjectLease(meta, out, ShardSpec(0, 2))
        with pytest.raises(LockedError, match="in use by a running bulkembed"):
            shard.acquire()
        taken = run_cli(corpus, tiny_st("mean"), out, "--break-lock")
        assert taken.exit_code == 0, taken.output
        time.sleep(6)  # two renewals: the first finds the lease taken
        with pytest.raises(LeaseLost, match="taken over by another run; this run stops here"):
            holder.check()
        with pytest.raises(LeaseLost, match="taken over by another run; this run stops here"):
            holder.fence()()
    finally:
        holder.release()
    assert _table(out).column("id").to_pylist() == ["a"]


def test_an_expired_lease_is_taken_over_and_a_renewed_one_is_not(s3, monkeypatch):
    monkeypatch.setenv("BULKEMBED_LEASE_SECONDS", "2")
    meta = location(s3.uri("leases")) / "_bulkembed"
    first = ObjectLease(meta, "out", None)
    first.acquire()
    time.sleep(2.5)  # renewed every half second: still live
    with pytest.raises(LockedError):
        ObjectLease(meta, "out", None).acquire()
    first._stop.set()  # a dead holder: no more renewals
    first._thread.join()
    time.sleep(2.2)
    second = ObjectLease(meta, "out", None)
    second.acquire()
    assert json.loads((meta / "lease").read_text())["token"] == second.token
    first._version = None  # the dead holder's release must not touch it
    second.release()
    assert not (meta / "lease").exists()


def test_break_lock_wins_over_a_holder_renewing_between_its_read_and_its_write(s3, monkeypatch):
    monkeypatch.setenv("BULKEMBED_LEASE_SECONDS", "60")
    meta = location(s3.uri("renewing")) / "_bulkembed"
    holder = ObjectLease(meta, "out", None)
    holder.acquire()
    lease = meta / "lease"
    renewals = []
    read = lease_module._read

    def read_then_renew(path):
        found = read(path)
        if len(renewals) < 2:  # the holder renews twice, each time right after a read
            renewals.append(path.write_if(holder._body(), found[1]))
        return found

    monkeypatch.setattr(lease_module, "_read", read_then_renew)
    taker = ObjectLease(meta, "out", None, take_over=True)
    try:
        taker.acquire()
        assert all(renewals) and len(renewals) == 2
        assert json.loads(lease.read_text())["token"] == taker.token
    finally:
        taker.release()
        holder._stop.set()
        holder._thread.join()
    assert not lease.exists()


def test_a_takeover_that_finds_another_runs_token_after_its_first_read_gives_up(s3, monkeypatch):
    monkeypatch.setenv("BULKEMBED_LEASE_SECONDS", "60")
    meta = location(s3.uri("raced")) / "_bulkembed"
    holder = ObjectLease(meta, "out", None)
    holder.acquire()
    rival = ObjectLease(meta, "out", None, take_over=True)
    read = lease_module._read
    taken = []

    def read_then_rival_takes_it(path):
        found = read(path)
        if not taken:
            taken.append(path.write_if(rival._body(), found[1]))
        return found

    monkeypatch.setattr(lease_module, "_read", read_then_rival_takes_it)
    try:
        with pytest.raises(LockedError, match="was taken by another bulkembed starting at"):
            ObjectLease(meta, "out", None, take_over=True).acquire()
        assert json.loads((meta / "lease").read_text())["token"] == rival.token
    finally:
        holder._stop.set()
        holder._thread.join()


@pytest.mark.parametrize("case", ["wrong-keys", "missing-bucket", "unreachable"])
def test_an_s3_output_that_cannot_be_used_is_one_line_and_writes_nothing(
    tmp_path, s3, tiny_st, monkeypatch, case
):
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"id": "a", "text": "one text"}])
    out = s3.uri("never")
    if case == "wrong-keys":
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    elif case == "missing-bucket":
        out = "s3://no-such-bucket/out"
    else:
        monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    storage.filesystem.cache_clear()
    storage_s3._cached_s3_client.cache_clear()
    result = run_cli(corpus, tiny_st("mean"), out)
    assert result.exit_code != 0
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and out.split("/out")[0] in lines[0], result.output
    assert "Traceback" not in result.output
    monkeypatch.undo()
    for key, value in s3.server.environment.items():
        os.environ[key] = value
    storage.filesystem.cache_clear()
    storage_s3._cached_s3_client.cache_clear()
    assert s3.keys() == []


def test_parts_and_markers_are_read_back_from_s3_by_status_and_since(tmp_path, s3, tiny_st):
    records = [{"id": f"d{i}", "text": t} for i, t in enumerate(sample_texts(40))]
    corpus = write_jsonl(tmp_path / "c.jsonl", records)
    model = tiny_st("mean")
    first = s3.uri("v1")
    assert run_cli(corpus, model, first, *FLOAT32).exit_code == 0
    records[3]["text"] = "a changed text"
    write_jsonl(corpus, records[:-1])
    second = s3.uri("v2")
    result = run_cli(corpus, model, second, *FLOAT32, "--since", first)
    assert result.exit_code == 0, result.output
    fresh = tmp_path / "fresh"
    assert run_cli(corpus, model, fresh, *FLOAT32).exit_code == 0
    expected = read_output(fresh)
    got = _table(second)
    vectors = dict(zip(got.column("id").to_pylist(), got.column("dense").to_pylist(), strict=True))
    assert sorted(vectors) == sorted(expected)
    ids = sorted(expected)
    a = np.array([vectors[i] for i in ids])
    b = np.array([expected[i] for i in ids])
    assert np.abs(a - b).max() < 1e-6
    summary = json.loads((location(second) / "_bulkembed" / "summary.json").read_text())
    assert summary["docs"] == 39
    assert "AWS_SECRET" not in json.dumps(summary) and s3.server.secret_key not in json.dumps(
        summary
    )
    config = (location(second) / "_bulkembed" / "config.json").read_text()
    assert s3.server.secret_key not in config
    assert pa is not None


def test_uploads_cut_short_under_the_output_are_aborted_on_restart(tmp_path, s3, tiny_st):
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"id": "a", "text": "one text"}])
    client = s3.server.client()
    # What a process killed while uploading a part leaves: an upload that never completed.
    client.create_multipart_upload(Bucket=s3.name, Key="cut/part-00000-000000.parquet")
    client.create_multipart_upload(Bucket=s3.name, Key="elsewhere/file.bin")
    result = run_cli(corpus, tiny_st("mean"), s3.uri("cut"))
    assert result.exit_code == 0, result.output
    left = [u["Key"] for u in client.list_multipart_uploads(Bucket=s3.name).get("Uploads", [])]
    assert left == ["elsewhere/file.bin"]


def test_a_holder_whose_renewals_fail_stops_before_its_lease_can_expire(s3, monkeypatch):
    monkeypatch.setenv("BULKEMBED_LEASE_SECONDS", "4")
    meta = location(s3.uri("stale")) / "_bulkembed"
    holder = ObjectLease(meta, "out", None)
    holder.acquire()
    fence = holder.fence()
    holder.check()
    fence()  # a device process's check, through the store
    holder._stop.set()  # renewals stop, as when the store cannot be reached
    holder._thread.join()
    time.sleep(3.2)  # more than three quarters of the term since the last renewal
    with pytest.raises(LeaseLost, match="could not be renewed in time"):
        holder.check()
    with pytest.raises(LeaseLost, match="was not renewed in time"):
        fence()
    holder._thread = None
    holder.release()


@pytest.mark.parametrize(
    ("output", "message"),
    [
        ("lancedb:/tmp/db?table=t", "a URI needs '://' after its scheme"),
        ("s3:/bucket/out", "a URI needs '://' after its scheme"),
        ("hdfs://namenode/out", "not a path or URI bulkembed reads or writes"),
    ],
)
def test_an_output_that_looks_like_a_mistyped_uri_is_refused(tmp_path, tiny_st, output, message):
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"id": "a", "text": "one text"}])
    result = run_cli(corpus, tiny_st("mean"), output)
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output
    assert not list(ROOT.glob("lancedb:*")) and not list(ROOT.glob("s3:*"))


def test_shards_on_a_store_without_conditional_writes_are_refused(tmp_path, tiny_st):
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"id": "a", "text": "one text"}])
    result = run_cli(corpus, tiny_st("mean"), "gs://bucket/out", "--shard", "0/2")
    assert result.exit_code == 2
    assert "--shard writing to gs:// needs conditional writes" in result.output


def test_a_run_file_replaced_while_it_is_read_is_read_again(s3, monkeypatch):
    from bulkembed.run_dir.files import read_json
    from bulkembed.storage import ObjectPath

    path = location(s3.uri("replaced/config.json"))
    assert isinstance(path, ObjectPath)
    path.write_text(json.dumps({"run": "abc", "shard": "1/3"}))
    read_text = ObjectPath.read_text
    reads = []

    def cut_once(self, encoding="utf-8"):
        text = read_text(self, encoding)
        reads.append(text)
        return text[:10] if len(reads) == 1 else text

    monkeypatch.setattr(ObjectPath, "read_text", cut_once)
    assert read_json(path) == {"run": "abc", "shard": "1/3"}
    assert len(reads) == 2
    path.write_text('{"run": "ab')
    reads.clear()
    with pytest.raises(OutputError, match=r"^cannot read s3://.*the output is damaged"):
        read_json(path)
    assert len(reads) == 3


def test_a_bucket_removed_mid_run_is_the_error_reported(tmp_path, s3, tiny_st, monkeypatch):
    corpus = write_jsonl(tmp_path / "c.jsonl", records(30))
    out = s3.uri("gone")
    mark_done = RunDirectory.mark_done

    def remove_the_bucket_after_the_first_unit(self, record, bad):
        mark_done(self, record, bad)
        client = s3.server.client()
        keys = [{"Key": key} for key in s3.keys(prefix="")]
        client.delete_objects(Bucket=s3.name, Delete={"Objects": keys})
        client.delete_bucket(Bucket=s3.name)

    monkeypatch.setattr(RunDirectory, "mark_done", remove_the_bucket_after_the_first_unit)
    result = run_cli(corpus, tiny_st("mean"), out, "--records-per-unit", "10")
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "The specified bucket does not exist" in lines[0], result.stderr
    # The first failure, not the lease's clean-up after it.
    assert "DeleteObject" not in lines[0], lines[0]


def test_a_lease_that_expires_centuries_ahead_is_shown_as_a_date(tmp_path, s3, tiny_st):
    corpus = write_jsonl(tmp_path / "c.jsonl", records(3))
    out = s3.uri("odd")
    lease = {"holder": "pid 1 on elsewhere", "token": "t", "expires": 9999999999, "host": "x"}
    (location(out) / "_bulkembed" / "lease").write_bytes(json.dumps(lease).encode())
    result = run_cli(corpus, tiny_st("mean"), out)
    assert result.exit_code == 75
    assert result.stderr == (
        f"error: {out} is in use by a running bulkembed (pid 1 on elsewhere; its lease runs "
        "until 2286-11-20 17:46 UTC, further ahead than any renewal sets it); wait for it to "
        "finish or stop it, or pass --break-lock if that run is dead\n"
    )


def _count_marker_reads(monkeypatch):
    """Reads of done-markers (objects under `_bulkembed/done/`), counted as they are made."""
    reads = []
    read_bytes = storage.ObjectPath.read_bytes

    def counted(self):
        if "/_bulkembed/done/" in self.key:
            reads.append(self.name)
        return read_bytes(self)

    monkeypatch.setattr(storage.ObjectPath, "read_bytes", counted)
    return reads


def test_a_restart_on_s3_reads_the_snapshot_and_the_markers_written_since(
    tmp_path, s3, tiny_st, monkeypatch
):
    from bulkembed.run_dir import ledger

    corpus = _corpus(tmp_path / "corpus", n=240, row_group_size=2)
    model = tiny_st("mean")
    reference = tmp_path / "reference"
    options = (*FLOAT32, "--records-per-unit", "2")
    assert run_cli(corpus, model, reference, *options).exit_code == 0
    units = len(list((reference / "_bulkembed" / "done").glob("part-*.json")))
    assert units == 121  # a unit of bad records alone has no part

    out = s3.uri("snapshot")
    monkeypatch.setattr(ledger, "SNAPSHOT_EVERY", 25)
    with monkeypatch.context() as failing:
        fail_at_commit(failing, 90, OSError(errno.EIO, "Input/output error"))
        assert run_cli(corpus, model, out, *options).exit_code != 0
    # 89 units marked done (the 90th part failed): snapshots after 25, 50 and 75 markers.
    assert "snapshot/_bulkembed/ledger.json" in s3.keys("snapshot/_bulkembed/")
    reads = _count_marker_reads(monkeypatch)
    result = run_cli(corpus, model, out, *options)
    assert result.exit_code == 0, result.output
    # The 14 markers written since the last snapshot, each read once; no other.
    assert len(reads) == len(set(reads)) == 14
    _assert_same_rows(_table(out), pq.read_table(sorted(reference.glob("*.parquet"))).sort_by("id"))

    # A finished output: its snapshot holds every marker.
    reads.clear()
    assert run_cli(corpus, model, out, *options).exit_code == 0
    assert reads == []
    assert _status(out)["units_done"] == units

    # A snapshot that does not read whole is ignored: every marker is read.
    snapshot = location(out) / "_bulkembed" / "ledger.json"
    text = snapshot.read_text()
    snapshot.write_text(text.replace('"rows": 2', '"rows": 3', 1))
    # The markers' counts, not the edited snapshot's (22 of the 240 texts are null).
    assert _status(out)["docs"] == 218
    assert len(set(reads)) == units
    # An edited marker is read, not taken from the snapshot.
    snapshot.write_text(text)
    reads.clear()
    marker = location(out) / "_bulkembed" / "done" / "part-00000-000000.json"
    marker.write_text(marker.read_text().replace('"bad": []', '"bad": [] '))
    assert _status(out)["units_done"] == units
    assert set(reads) == {"part-00000-000000.json"}

"""`--engine ray` on a local Ray instance: the local engine's output, resumable after a kill."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch
from helpers import (
    ROOT,
    cosines,
    incremental_corpora,
    read_output,
    run_arguments,
    run_cli,
    sample_texts,
    write_jsonl,
    write_parquet,
)
from typer.testing import CliRunner

from bulkembed.cli import app

pytest.importorskip("ray.data")
pytestmark = pytest.mark.slow

# Units: JSONL files of 700 lines (one unit) and 4,500 lines (two: 4,096 and 404), and 30
# Parquet row groups of 100 rows.
ROW_GROUPS = 30
LINES = (700, 4500)
DOCS = sum(LINES) + ROW_GROUPS * 100
UNITS = 3 + ROW_GROUPS


def _corpus(folder):
    texts = sample_texts(1000)
    for n, lines in enumerate(LINES):
        records = [{"id": f"j{n}-{i}", "text": texts[(3 * i + n) % 1000]} for i in range(lines)]
        write_jsonl(folder / f"lines-{n}.jsonl", records)
    records = [{"id": f"p{i}", "text": texts[(7 * i) % 1000]} for i in range(ROW_GROUPS * 100)]
    write_parquet(folder / "table.parquet", records, row_group_size=100)
    return folder


def _environment():
    """Ray workers import bulkembed from this checkout; no cluster address is given, so each
    run starts a local instance (2 CPUs on the test machine)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    environment = {**os.environ, "PYTHONPATH": path}
    environment.pop("RAY_ADDRESS", None)
    return environment


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_st):
    """The corpus and the local engine's output for it."""
    folder = tmp_path_factory.mktemp("ray")
    corpus = _corpus(folder / "corpus")
    model = tiny_st("mean")
    result = CliRunner().invoke(app, run_arguments(corpus, model, folder / "local", "-q"))
    assert result.exit_code == 0, result.output
    return corpus, model, read_output(folder / "local")


def _ray_run(corpus, model, out, *extra):
    arguments = run_arguments(corpus, model, out, "--engine", "ray", *extra)
    command = [sys.executable, "-m", "bulkembed", *arguments]
    return subprocess.Popen(
        command, env=_environment(), stderr=subprocess.PIPE, start_new_session=True
    )


def _same_as(expected, out):
    got = read_output(out)  # fails on an id written twice
    assert sorted(got) == sorted(expected) and len(got) == DOCS
    ids = sorted(expected)
    assert cosines([got[i] for i in ids], [expected[i] for i in ids]).min() >= 0.9999


def test_the_ray_engine_writes_what_the_local_engine_writes(tmp_path, reference):
    corpus, model, expected = reference
    run = _ray_run(corpus, model, tmp_path / "out")
    _, stderr = run.communicate(timeout=300)
    assert run.returncode == 0, stderr.decode()
    assert "on Ray: 1 cpu actor of " in stderr.decode()
    _same_as(expected, tmp_path / "out")
    status = json.loads(CliRunner().invoke(app, ["status", str(tmp_path / "out"), "--json"]).output)
    units = UNITS
    assert (status["state"], status["units_done"], status["units_pending"]) == (
        "complete",
        units,
        0,
    )
    summary = json.loads((tmp_path / "out" / "_bulkembed" / "summary.json").read_text())
    assert (summary["docs"], summary["docs_this_run"], summary["units"]) == (DOCS, DOCS, units)
    assert summary["device"] == "cpu x1 on Ray"


def test_a_killed_ray_run_resumes_with_each_id_once(tmp_path, reference):
    corpus, model, expected = reference
    out = tmp_path / "out"
    run = _ray_run(corpus, model, out)
    markers = out / "_bulkembed" / "done"
    deadline = time.monotonic() + 240
    while len(list(markers.glob("part-*.json"))) < 3:
        assert run.poll() is None, run.stderr.read().decode()
        assert time.monotonic() < deadline, "no unit was committed in time"
        time.sleep(0.02)
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()
    committed = len(list(markers.glob("part-*.json")))
    assert 3 <= committed < UNITS, "the run should be cut off midway"

    rerun = _ray_run(corpus, model, out)
    _, stderr = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, stderr.decode()
    # Ray's workers may commit a unit or two more before they notice the driver is gone.
    pending, done = re.search(r"(\d+) units? to embed, (\d+) done before", stderr.decode()).groups()
    assert int(pending) + int(done) == UNITS and int(done) >= committed
    _same_as(expected, out)
    summary = json.loads((out / "_bulkembed" / "summary.json").read_text())
    assert summary["docs"] == DOCS and summary["docs_this_run"] < DOCS


def test_ray_options_that_cannot_work_are_refused(tmp_path, reference):
    corpus, model, _ = reference
    arguments = run_arguments(corpus, model, "-", "--engine", "ray")
    result = CliRunner().invoke(app, arguments)
    assert result.exit_code == 2
    message = "--engine ray writes from several processes, and stdout takes rows from one"
    assert message in result.output
    result = CliRunner().invoke(
        app, [*run_arguments(corpus, model, tmp_path / "o"), "--ray-address", "x"]
    )
    assert result.exit_code == 2
    assert "--ray-address applies to --engine ray only" in result.output
    table = f"lancedb://{tmp_path / 'db'}/docs"
    since = ["--engine", "ray", "--since", table]
    result = CliRunner().invoke(app, [*run_arguments(corpus, model, table), *since, "-q"])
    assert result.exit_code == 2
    assert result.output.strip() == (
        "error: --engine ray cannot be combined with syncing a LanceDB table in place: its "
        "tasks read the table's rows in this process only; sync it with --shard I/N, or "
        "write a Parquet output with --engine ray and --since and apply its change set"
    )


def _by_id(table: pa.Table) -> pa.Table:
    return table.take(pc.sort_indices(table, [("id", "ascending")]))


def _assert_same_rows(a: pa.Table, b: pa.Table) -> None:
    assert a.column("id").to_pylist() == b.column("id").to_pylist()
    assert a.column("content_hash").equals(b.column("content_hash"))
    dense = [np.array(t.column("dense").to_pylist(), np.float32) for t in (a, b)]
    np.testing.assert_allclose(*dense, atol=1e-6)


@pytest.mark.parametrize("killed", [False, True], ids=["whole", "killed-then-rerun"])
def test_since_on_ray_gives_the_one_machine_change_set(tmp_path, tiny_st, killed):
    kinds = incremental_corpora(tmp_path)
    model = tiny_st("mean")
    for corpus, out, extra in (("v1", "out-v1", ()), ("v2", "one", ("--since", "out-v1"))):
        since = [str(tmp_path / e) if e == "out-v1" else e for e in extra]
        result = run_cli(tmp_path / corpus, model, tmp_path / out, "--dtype", "float32", *since)
        assert result.exit_code == 0, result.output
    out, since = tmp_path / "ray", ("--since", str(tmp_path / "out-v1"))
    if killed:
        run = _ray_run(tmp_path / "v2", model, out, *since)
        markers = out / "_bulkembed" / "done"
        deadline = time.monotonic() + 240
        while not list(markers.glob("part-*.json")):
            assert run.poll() is None, run.stderr.read().decode()
            assert time.monotonic() < deadline, "no unit was committed in time"
            time.sleep(0.02)
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
        assert not (out / "_bulkembed" / "complete").exists()
    run = _ray_run(tmp_path / "v2", model, out, *since)
    _, stderr = run.communicate(timeout=300)
    assert run.returncode == 0, stderr.decode()

    one = tmp_path / "one" / "_bulkembed" / "changes"
    changes = out / "_bulkembed" / "changes"
    _assert_same_rows(
        _by_id(pq.read_table(changes / "upserts")), _by_id(pq.read_table(one / "upserts"))
    )
    upserted = set(pq.read_table(changes / "upserts")["id"].to_pylist())
    assert upserted == kinds["new"] | kinds["changed"]
    deletes = sorted(pq.read_table(changes / "deletes.parquet")["id"].to_pylist())
    assert deletes == sorted(kinds["deleted"])
    _assert_same_rows(_by_id(pq.read_table(out)), _by_id(pq.read_table(tmp_path / "one")))
    summaries = [
        json.loads((o / "_bulkembed" / "summary.json").read_text()) for o in (out, tmp_path / "one")
    ]
    counted = ("docs", "new", "changed", "unchanged", "deleted", "tokens", "tokens_embedded")
    assert [{k: s[k] for k in counted} for s in summaries] == [
        {k: summaries[1][k] for k in counted}
    ] * 2
    if not killed:
        assert summaries[0]["docs_this_run"] == 8


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_ray_puts_one_actor_on_each_gpu(tmp_path, reference):
    corpus, model, expected = reference
    run = _ray_run(corpus, model, tmp_path / "out", "--devices", "auto")
    _, stderr = run.communicate(timeout=300)
    assert run.returncode == 0, stderr.decode()
    assert f"{torch.cuda.device_count()} cuda actor" in stderr.decode()
    _same_as(expected, tmp_path / "out")

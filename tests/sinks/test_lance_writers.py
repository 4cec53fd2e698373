"""Many writers into one LanceDB table: `--shard` runs side by side, killed ones rerun,
several devices, Ray actors. Each writes what one process writes, each id once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from helpers import (
    HARNESS,
    ROOT,
    run_arguments,
    sample_texts,
    status_of,
    write_jsonl,
    write_parquet,
)
from typer.testing import CliRunner

from bulkembed.cli import app

lancedb = pytest.importorskip("lancedb")
pytestmark = pytest.mark.slow

# 100 records per JSONL unit: two files of 250 lines are three units each; the Parquet file's
# five row groups are five more. 600 documents, 11 units.
UNIT = ("--records-per-unit", "100")
DOCS, UNITS = 600, 11


def _corpus(folder: Path) -> Path:
    texts = sample_texts(250)
    for n in range(2):
        records = [{"id": f"j{n}-{i}", "text": texts[(3 * i + n) % 250]} for i in range(250)]
        write_jsonl(folder / f"lines-{n}.jsonl", records)
    records = [{"id": f"p{i}", "text": texts[(7 * i) % 250][:200]} for i in range(100)]
    write_parquet(folder / "table.parquet", records, row_group_size=20)
    return folder


def _out(db: Path | str) -> str:
    """A local database folder, or `s3://...` for one on the S3 server."""
    if isinstance(db, str):
        return f"lancedb+{db}?table=t"
    return f"lancedb://{db}?table=t"


def _arguments(corpus: Path, model: Path, db: Path | str, *extra: str) -> list[str]:
    return run_arguments(corpus, model, _out(db), "-q", *UNIT, *extra)


def _environment() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def _start(
    arguments: list[str], fault: tuple[str, int] | None = None, signal_name: str = "SIGKILL"
) -> subprocess.Popen:
    """`bulkembed` with `arguments` in a process of its own; with `fault` (stage, n), sent
    `signal_name` at the nth pass through the stage (`fault_harness`)."""
    if fault is None:
        command = [sys.executable, "-m", "bulkembed", *arguments]
    else:
        stage, n = fault
        command = [sys.executable, str(HARNESS), stage, str(n), signal_name, "--", *arguments]
    return subprocess.Popen(command, stderr=subprocess.PIPE, env=_environment())


def _shards(
    corpus: Path, model: Path, db: Path | str, fault: tuple[str, int] | None = None
) -> list:
    """Three `--shard i/3` runs side by side; `fault` kills shard 1. Their exit codes."""
    runs = [
        _start(_arguments(corpus, model, db, "--shard", f"{i}/3"), fault if i == 1 else None)
        for i in range(3)
    ]
    codes = []
    for run in runs:
        _, stderr = run.communicate(timeout=300)
        codes.append(run.returncode)
        assert run.returncode in (0, -9), stderr.decode()
    return codes


def _table(db: Path | str) -> pa.Table:
    """The table's rows in id order; no id may be there twice."""
    options = {}
    if isinstance(db, str):
        endpoint = os.environ["AWS_ENDPOINT_URL"]
        options = {"endpoint": endpoint, "allow_http": "true", "region": "us-east-1"}
    table = lancedb.connect(db, storage_options=options).open_table("t").to_arrow().sort_by("id")
    ids = table.column("id").to_pylist()
    assert len(ids) == len(set(ids)), "an id is in the table more than once"
    return table


def _assert_same(db: Path | str, expected: pa.Table) -> None:
    got = _table(db)
    assert got.column("id").to_pylist() == expected.column("id").to_pylist()
    assert len(got) == DOCS
    vectors = np.array(got.column("vector").to_pylist())
    np.testing.assert_allclose(vectors, np.array(expected.column("vector").to_pylist()), atol=1e-6)
    assert got.column("content_hash").equals(expected.column("content_hash"))


def _status(db: Path | str) -> dict:
    return status_of(_out(db))


@pytest.fixture(scope="module")
def whole(tmp_path_factory, tiny_st):
    """The corpus, the model, and what one process writes for them."""
    folder = tmp_path_factory.mktemp("lance-writers")
    corpus, model = _corpus(folder / "corpus"), tiny_st("mean")
    result = CliRunner().invoke(app, _arguments(corpus, model, folder / "whole"))
    assert result.exit_code == 0, result.output
    return corpus, model, _table(folder / "whole")


def test_three_shards_side_by_side_write_what_one_process_writes(tmp_path, whole):
    corpus, model, expected = whole
    assert _shards(corpus, model, tmp_path / "db") == [0, 0, 0]
    _assert_same(tmp_path / "db", expected)
    status = _status(tmp_path / "db")
    assert (status["state"], status["units_done"], status["docs"]) == ("complete", UNITS, DOCS)
    intents = tmp_path / "db" / "_bulkembed" / "t" / "intents"
    assert len(list(intents.glob("part-*.json"))) == UNITS


@pytest.mark.parametrize(
    ("stage", "n"),
    [
        ("fragments", 2),  # a unit's data files written, not committed
        ("append", 2),  # a unit committed, not marked done
        ("marked", 2),  # a unit marked done
    ],
)
def test_a_shard_killed_then_all_rerun_write_each_id_once(tmp_path, whole, stage, n):
    corpus, model, expected = whole
    db = tmp_path / "db"
    assert _shards(corpus, model, db, (stage, n)) == [0, -9, 0]
    done = len(list((db / "_bulkembed" / "t" / "done").glob("part-*.json")))
    assert done < UNITS and _status(db)["state"] != "complete"
    assert _shards(corpus, model, db) == [0, 0, 0]
    _assert_same(db, expected)
    status = _status(db)
    assert (status["state"], status["units_done"], status["docs"]) == ("complete", UNITS, DOCS)


@pytest.mark.parametrize("stage", ["fragments", "append"])
def test_three_shards_into_one_table_on_s3_killed_and_rerun_write_each_id_once(s3, whole, stage):
    corpus, model, expected = whole
    db = s3.uri("lance/db")
    assert _shards(corpus, model, db, (stage, 2)) == [0, -9, 0]
    assert _status(db)["state"] != "complete"
    assert _shards(corpus, model, db) == [0, 0, 0]
    _assert_same(db, expected)
    status = _status(db)
    assert (status["state"], status["units_done"], status["docs"]) == ("complete", UNITS, DOCS)
    keys = s3.keys("lance/db/_bulkembed/t/")
    assert len([k for k in keys if "/intents/part-" in k]) == UNITS
    assert not [k for k in keys if "lease" in k]


def test_two_devices_write_what_one_writes(tmp_path, whole):
    corpus, model, expected = whole
    result = CliRunner().invoke(
        app, _arguments(corpus, model, tmp_path / "db", "--devices", "cpu,cpu")
    )
    assert result.exit_code == 0, result.output
    _assert_same(tmp_path / "db", expected)
    assert _status(tmp_path / "db")["state"] == "complete"


def test_the_ray_engine_writes_what_one_process_writes(tmp_path, whole):
    pytest.importorskip("ray.data")
    corpus, model, expected = whole
    environment = _environment()
    environment.pop("RAY_ADDRESS", None)
    run = subprocess.run(
        [sys.executable, "-m", "bulkembed", *_arguments(corpus, model, tmp_path / "db")]
        + ["--engine", "ray"],
        env=environment,
        capture_output=True,
        timeout=400,
    )
    assert run.returncode == 0, run.stderr.decode()
    _assert_same(tmp_path / "db", expected)
    status = _status(tmp_path / "db")
    assert (status["state"], status["units_done"]) == ("complete", UNITS)


def _wait_until_stopped(pid: int) -> None:
    deadline = time.monotonic() + 300
    while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
        assert time.monotonic() < deadline, "the run never stopped"
        time.sleep(0.1)


def test_a_run_frozen_while_another_takes_its_lease_stops_before_it_commits(s3, whole):
    corpus, model, expected = whole
    db = s3.uri("lance/frozen")
    # Frozen with a unit's data files written, not committed; its lease taken meanwhile.
    frozen = _start(_arguments(corpus, model, db), ("fragments", 2), "SIGSTOP")
    try:
        _wait_until_stopped(frozen.pid)
        taker = _start(_arguments(corpus, model, db, "--break-lock"))
        _, stderr = taker.communicate(timeout=300)
        assert taker.returncode == 0, stderr.decode()
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
    _, stderr = frozen.communicate(timeout=300)
    lines = stderr.decode().strip().splitlines()
    assert frozen.returncode == 75, stderr.decode()
    assert lines[-1].startswith("error: ") and lines[-1].endswith(
        "was taken over by another run; this run stops here"
    )
    _assert_same(db, expected)
    assert _status(db)["state"] == "complete"

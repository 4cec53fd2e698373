"""An in-place LanceDB sync shared out among `--shard` runs: the same table as the sync of
one run, also when the shards run at once, and after one of them is killed and run again."""

import json
import shutil
import subprocess
import sys

import lancedb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from helpers import HARNESS, assert_table_is_the_rebuild, incremental_corpora, run_cli

# float32 on every CPU, so that vectors compare at float32 precision across runs; a short
# maximum length, so that some documents are truncated.
SETTINGS = ("--dtype", "float32", "--max-length", "24")


def _by_id(table: pa.Table) -> pa.Table:
    return table.take(pc.sort_indices(table, [("id", "ascending")]))


def _table(db) -> pa.Table:
    return _by_id(lancedb.connect(db).open_table("docs").to_arrow())


def _arguments(corpus, model, uri, shard):
    arguments = ["run", str(corpus), "--model", str(model), "--output", uri, "--quiet"]
    return [*arguments, "--tokenize-workers", "0", *SETTINGS, "--since", uri, "--shard", shard]


def _shards_at_once(corpus, model, uri):
    """Both shards, started together, as a job array starts them."""
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "bulkembed", *_arguments(corpus, model, uri, shard)],
            stderr=subprocess.PIPE,
            text=True,
        )
        for shard in ("0/2", "1/2")
    ]
    for run in runs:
        _, stderr = run.communicate(timeout=300)
        assert run.returncode == 0, stderr


@pytest.fixture(scope="module")
def versions(tmp_path_factory, tiny_st):
    """v1 embedded into a LanceDB table (copied by each test), and v1 and v2 embedded in
    full into Parquet outputs: what a sync must make of the table."""
    folder = tmp_path_factory.mktemp("sync-shards")
    incremental_corpora(folder)
    model = tiny_st("mean")
    runs = (("v1", f"lancedb://{folder / 'lance-v1'}?table=docs"), ("v1", folder / "full-v1"))
    for corpus, out in (*runs, ("v2", folder / "full-v2")):
        result = run_cli(folder / corpus, model, out, *SETTINGS)
        assert result.exit_code == 0, result.output
    return folder, model


@pytest.mark.slow
def test_two_shards_at_once_sync_the_table_as_one_run_does(versions, tmp_path):
    folder, model = versions
    db = tmp_path / "db"
    shutil.copytree(folder / "lance-v1", db)
    uri = f"lancedb://{db}?table=docs"
    _shards_at_once(folder / "v2", model, uri)
    assert_table_is_the_rebuild(_table(db), _by_id(pq.read_table(folder / "full-v2")))
    summary = json.loads((db / "_bulkembed" / "docs" / "summary.json").read_text())
    counts = {k: summary[k] for k in ("docs", "new", "changed", "unchanged", "deleted")}
    assert counts == {"docs": 1001, "new": 3, "changed": 5, "unchanged": 993, "deleted": 2}

    # The next sync, with other inputs (v1 again), starts the sync's ledger over once.
    _shards_at_once(folder / "v1", model, uri)
    assert_table_is_the_rebuild(_table(db), _by_id(pq.read_table(folder / "full-v1")))
    summary = json.loads((db / "_bulkembed" / "docs" / "summary.json").read_text())
    counts = {k: summary[k] for k in ("docs", "new", "changed", "deleted")}
    assert counts == {"docs": 1000, "new": 2, "changed": 5, "deleted": 3}


@pytest.mark.slow
def test_a_shard_killed_mid_sync_then_run_again_gives_the_same_table(versions, tmp_path):
    folder, model = versions
    db = tmp_path / "db"
    shutil.copytree(folder / "lance-v1", db)
    uri = f"lancedb://{db}?table=docs"
    # Shard 0 dies with its first unit merged into the table and not marked done.
    arguments = _arguments(folder / "v2", model, uri, "0/2")
    command = [sys.executable, str(HARNESS), "merged", "1", "SIGKILL", "--", *arguments]
    killed = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -9, killed.stderr
    result = run_cli(folder / "v2", model, uri, *SETTINGS, "--since", uri, "--shard", "1/2")
    assert result.exit_code == 0, result.output
    # Shard 0's units are pending: nothing is deleted yet, and the sync is not finished.
    assert {"doc-10", "doc-700"} <= set(_table(db)["id"].to_pylist())
    assert not (db / "_bulkembed" / "docs" / "sync" / "_bulkembed" / "complete").exists()
    result = run_cli(folder / "v2", model, uri, *SETTINGS, "--since", uri, "--shard", "0/2")
    assert result.exit_code == 0, result.output
    assert_table_is_the_rebuild(_table(db), _by_id(pq.read_table(folder / "full-v2")))
    summary = json.loads((db / "_bulkembed" / "docs" / "summary.json").read_text())
    assert (summary["docs"], summary["new"], summary["changed"], summary["deleted"]) == (
        1001,
        3,
        5,
        2,
    )

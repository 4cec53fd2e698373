"""`--since` change sets: upserts and deletes that take the previous output to a full
re-embed of the new corpus, exactly once after crashes; summary counts over the output."""

import json
import shutil
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from fault_harness import run_forked
from helpers import (
    HARNESS,
    ROOT,
    assert_table_is_the_rebuild,
    incremental_corpora,
    run_cli,
    write_jsonl,
)
from typer.testing import CliRunner

from bulkembed.cli import app

# float32 on every CPU, so that vectors compare at float32 precision across runs; a short
# maximum length, so that some documents are truncated.
SETTINGS = ("--dtype", "float32", "--max-length", "24")


def _summary(out):
    return json.loads((out / "_bulkembed" / "summary.json").read_text())


def _by_id(table: pa.Table) -> pa.Table:
    return table.take(pc.sort_indices(table, [("id", "ascending")]))


def _upserts(out) -> pa.Table:
    return _by_id(pq.read_table(out / "_bulkembed" / "changes" / "upserts"))


def _deletes(out) -> list[str]:
    return sorted(
        pq.read_table(out / "_bulkembed" / "changes" / "deletes.parquet")["id"].to_pylist()
    )


def _assert_same_rows(a: pa.Table, b: pa.Table) -> None:
    assert a.column("id").to_pylist() == b.column("id").to_pylist()
    assert a.column("content_hash").equals(b.column("content_hash"))
    np.testing.assert_allclose(
        np.array(a.column("dense").to_pylist()), np.array(b.column("dense").to_pylist()), atol=1e-6
    )


@pytest.fixture(scope="module")
def synced(tmp_path_factory, tiny_st):
    """v1 embedded, v2 embedded `--since` v1, and v2 embedded in full."""
    folder = tmp_path_factory.mktemp("sync")
    kinds = incremental_corpora(folder)
    model = tiny_st("mean")
    for corpus, out, extra in (
        ("v1", "out-v1", ()),
        ("v2", "out-v2", ("--since", folder / "out-v1")),
        ("v2", "full", ()),
    ):
        result = run_cli(folder / corpus, model, folder / out, *SETTINGS, *extra)
        assert result.exit_code == 0, result.output
    return folder, model, kinds


def test_change_set_holds_the_new_and_changed_rows_and_the_deleted_ids(synced):
    folder, _, kinds = synced
    upserts = _upserts(folder / "out-v2")
    assert sorted(upserts.column("id").to_pylist()) == sorted(kinds["new"] | kinds["changed"])
    assert upserts.schema == pq.read_schema(next((folder / "out-v2").glob("part-*.parquet")))
    full = _by_id(pq.read_table(folder / "full"))
    _assert_same_rows(upserts, full.filter(pc.is_in(full["id"], upserts["id"])))
    assert _deletes(folder / "out-v2") == sorted(kinds["deleted"])


def test_change_set_applied_to_the_previous_output_equals_a_full_re_embed(synced):
    folder, _, _ = synced
    previous = pq.read_table(folder / "out-v1")
    upserts = pq.read_table(folder / "out-v2" / "_bulkembed" / "changes" / "upserts")
    deletes = pq.read_table(folder / "out-v2" / "_bulkembed" / "changes" / "deletes.parquet")
    gone = pa.concat_arrays([deletes["id"].combine_chunks(), upserts["id"].combine_chunks()])
    kept = previous.filter(pc.invert(pc.is_in(previous["id"], gone)))
    applied = _by_id(pa.concat_tables([kept, upserts]))
    full = _by_id(pq.read_table(folder / "full"))
    assert applied.num_rows == full.num_rows == 1001
    _assert_same_rows(applied, full)


def test_summary_counts_cover_the_whole_output(synced, tmp_path):
    folder, model, kinds = synced
    incremental, full = _summary(folder / "out-v2"), _summary(folder / "full")
    assert full["truncated"] > 0
    for key in ("docs", "tokens", "truncated"):
        assert incremental[key] == full[key], key
    counts = {k: incremental[k] for k in ("new", "changed", "unchanged", "deleted")}
    assert counts == {"new": 3, "changed": 5, "unchanged": 993, "deleted": 2}
    # What was embedded: the 8 upserts, counted as a run of those documents alone counts them.
    ids = kinds["new"] | kinds["changed"]
    corpus = pq.read_table(folder / "v2" / "a.parquet").to_pylist()
    corpus += [json.loads(line) for line in (folder / "v2" / "b.jsonl").read_text().splitlines()]
    only = tmp_path / "only.jsonl"
    only.write_text("".join(json.dumps(r) + "\n" for r in corpus if r["id"] in ids))
    assert run_cli(only, model, tmp_path / "only", *SETTINGS).exit_code == 0
    alone = _summary(tmp_path / "only")
    assert incremental["docs_embedded"] == alone["docs"] == 8
    assert incremental["tokens_embedded"] == alone["tokens"]
    assert incremental["truncated_embedded"] == alone["truncated"]


@pytest.mark.parametrize(
    ("stage", "n"),
    [
        ("committed", 1),  # the first unit's upserts committed, its part not yet
        ("committed", 4),  # a unit's part committed, its marker not yet written
        ("commit", 3),  # before a unit's marker
        ("deletes", 1),  # deletes written, the output not yet marked complete
    ],
)
def test_sigkill_during_since_then_rerun_gives_the_same_change_set(synced, tmp_path, stage, n):
    folder, model, _ = synced
    out = tmp_path / "out"
    killed = run_forked(stage, n, "SIGKILL", _since_arguments(folder, model, out))
    assert killed.returncode == -9, killed.stderr
    result = run_cli(folder / "v2", model, out, *SETTINGS, "--since", folder / "out-v1")
    assert result.exit_code == 0, result.output
    upserts, expected = _upserts(out), _upserts(folder / "out-v2")
    _assert_same_rows(upserts, expected)
    assert _deletes(out) == _deletes(folder / "out-v2")
    _assert_same_rows(_by_id(pq.read_table(out)), _by_id(pq.read_table(folder / "full")))
    assert not [p for p in out.rglob("*.tmp")]


def _since_arguments(folder, model, out, *extra):
    return [
        "run",
        str(folder / "v2"),
        "--model",
        str(model),
        "--output",
        str(out),
        "--quiet",
        "--tokenize-workers",
        "0",
        *SETTINGS,
        "--since",
        str(folder / "out-v1"),
        *extra,
    ]


@pytest.mark.parametrize("killed", [False, True], ids=["shards", "shard-killed-then-rerun"])
def test_since_on_two_shards_gives_the_one_machine_change_set(synced, tmp_path, killed):
    folder, model, _ = synced
    out = tmp_path / "out"
    since = ("--since", folder / "out-v1")
    if killed:
        # Shard 0 dies with its first unit's upserts committed and its part not yet.
        arguments = _since_arguments(folder, model, out, "--shard", "0/2")
        assert run_forked("committed", 1, "SIGKILL", arguments).returncode == -9
    first, second = ("1/2", "0/2") if killed else ("0/2", "1/2")
    result = run_cli(folder / "v2", model, out, *SETTINGS, *since, "--shard", first)
    assert result.exit_code == 0, result.output
    # The other shard's units are pending: no deletes decided yet.
    assert not (out / "_bulkembed" / "changes" / "deletes.parquet").exists()
    assert not (out / "_bulkembed" / "complete").exists()
    result = run_cli(folder / "v2", model, out, *SETTINGS, *since, "--shard", second)
    assert result.exit_code == 0, result.output

    _assert_same_rows(_upserts(out), _upserts(folder / "out-v2"))
    assert _deletes(out) == _deletes(folder / "out-v2")
    _assert_same_rows(_by_id(pq.read_table(out)), _by_id(pq.read_table(folder / "full")))
    assert (out / "_bulkembed" / "complete").exists()
    assert not [p for p in out.rglob("*.tmp")]


def test_the_documented_loader_applies_the_change_set(synced, tmp_path, monkeypatch):
    folder, _, _ = synced
    page = (ROOT / "docs" / "incremental.md").read_text()
    section = page.split("## Sync into a vector store", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "out-2026-11-21").symlink_to(folder / "out-v1")
    (tmp_path / "out-2026-11-22").symlink_to(folder / "out-v2")
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/incremental.md", "exec"), {})

    import duckdb

    with duckdb.connect(str(tmp_path / "search.duckdb")) as con:
        loaded = _by_id(con.sql("SELECT * FROM docs").to_arrow_table())
    _assert_same_rows(loaded, _by_id(pq.read_table(folder / "full")))


def _table(db) -> pa.Table:
    import lancedb

    return _by_id(lancedb.connect(db).open_table("docs").to_arrow())


def _assert_table_is_the_full_rebuild(table: pa.Table, full: pa.Table) -> None:
    assert table.num_rows == 1000 + 3 - 2
    assert_table_is_the_rebuild(table, full)


@pytest.fixture(scope="module")
def lance_v1(synced):
    """v1 embedded into a LanceDB table, kept to copy from."""
    folder, model, _ = synced
    uri = f"lancedb://{folder / 'lance-v1'}?table=docs"
    result = run_cli(folder / "v1", model, uri, *SETTINGS)
    assert result.exit_code == 0, result.output
    return folder / "lance-v1"


def test_lancedb_sync_in_place_equals_a_full_rebuild(synced, lance_v1, tmp_path):
    folder, model, _ = synced
    db = tmp_path / "db"
    shutil.copytree(lance_v1, db)
    before = _table(db)
    uri = f"lancedb://{db}?table=docs"
    result = run_cli(folder / "v2", model, uri, *SETTINGS, "--since", uri)
    assert result.exit_code == 0, result.output
    table = _table(db)
    _assert_table_is_the_full_rebuild(table, _by_id(pq.read_table(folder / "full")))
    # Unchanged rows keep their values exactly.
    kept = before.filter(pc.is_in(before["id"], table["id"]))
    same = table.filter(pc.is_in(table["id"], kept["id"]))
    unchanged = pc.equal(kept["content_hash"], same["content_hash"])
    assert kept.filter(unchanged)["vector"].equals(same.filter(unchanged)["vector"])
    summary = json.loads((db / "_bulkembed" / "docs" / "summary.json").read_text())
    full = _summary(folder / "full")
    assert {k: summary[k] for k in ("docs", "tokens", "truncated")} == {
        k: full[k] for k in ("docs", "tokens", "truncated")
    }
    assert (summary["new"], summary["changed"], summary["deleted"]) == (3, 5, 2)
    status = json.loads(CliRunner().invoke(app, ["status", uri, "--json"]).stdout)
    assert (status["output"], status["state"], status["docs"]) == (uri, "complete", 1001)
    again = run_cli(folder / "v2", model, uri, *SETTINGS, "--since", uri)
    assert again.exit_code == 0, again.output
    assert _table(db).equals(table)
    plain = run_cli(folder / "v1", model, uri, *SETTINGS)
    assert plain.exit_code == 2
    assert plain.output.strip() == (
        f"error: {uri} was synced in place since this run wrote it: sync it again with "
        "--since naming the table, or start over with --overwrite"
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("stage", "n"),
    [
        ("merged", 1),  # the first unit merged, not marked done
        ("merged", 3),  # likewise a later one
        ("deleted", 1),  # gone ids deleted, the table not compacted yet
        ("compacted", 1),  # the table compacted, the sync not marked complete
    ],
)
def test_sigkill_during_lancedb_sync_then_rerun_gives_the_same_table(
    synced, lance_v1, tmp_path, stage, n
):
    folder, model, _ = synced
    db = tmp_path / "db"
    shutil.copytree(lance_v1, db)
    uri = f"lancedb://{db}?table=docs"
    arguments = ["run", str(folder / "v2"), "--model", str(model), "--output", uri, "--quiet"]
    arguments += ["--tokenize-workers", "0", *SETTINGS, "--since", uri]
    command = [sys.executable, str(HARNESS), stage, str(n), "SIGKILL", "--", *arguments]
    killed = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -9, killed.stderr
    result = run_cli(folder / "v2", model, uri, *SETTINGS, "--since", uri)
    assert result.exit_code == 0, result.output
    _assert_table_is_the_full_rebuild(_table(db), _by_id(pq.read_table(folder / "full")))
    summary = json.loads((db / "_bulkembed" / "docs" / "summary.json").read_text())
    assert (summary["docs"], summary["new"], summary["changed"], summary["deleted"]) == (
        1001,
        3,
        5,
        2,
    )


def test_lancedb_since_must_name_the_output_table_and_a_table_bulkembed_wrote(synced, tmp_path):
    folder, model, _ = synced
    uri = f"lancedb://{tmp_path / 'db'}?table=docs"
    missing = run_cli(folder / "v2", model, uri, *SETTINGS, "--since", uri)
    assert missing.exit_code == 2
    assert missing.output.strip() == (
        f"error: --since {uri}: no table that bulkembed wrote is there; run once without "
        "--since to create it"
    )
    other = f"lancedb://{tmp_path / 'db'}?table=other"
    refused = run_cli(folder / "v2", model, uri, *SETTINGS, "--since", other)
    assert refused.exit_code == 2
    assert refused.output.strip() == (
        f"error: --since {other}: a lancedb output can only be synced in place: pass the "
        "same URI as --output"
    )
    limited = run_cli(folder / "v2", model, uri, *SETTINGS, "--since", uri, "--limit", "10")
    assert limited.exit_code == 2
    assert limited.output.strip() == (
        "error: --limit cannot be combined with syncing a LanceDB table in place: the "
        "documents past the limit would be deleted from it"
    )


def test_a_second_lancedb_sync_with_other_inputs_starts_its_ledger_over(synced, lance_v1, tmp_path):
    folder, model, _ = synced
    db = tmp_path / "db"
    shutil.copytree(lance_v1, db)
    uri = f"lancedb://{db}?table=docs"
    assert run_cli(folder / "v2", model, uri, *SETTINGS, "--since", uri).exit_code == 0
    # The next night: one more document changed, one added.
    v3 = pq.read_table(folder / "v2" / "a.parquet").to_pylist()
    v3 += [json.loads(line) for line in (folder / "v2" / "b.jsonl").read_text().splitlines()]
    v3[5]["text"] += " (edited again)"
    v3.append({"id": "new-night-2", "text": "a document of the second night"})
    write_jsonl(tmp_path / "v3" / "c.jsonl", v3)
    result = run_cli(tmp_path / "v3", model, uri, *SETTINGS, "--since", uri)
    assert result.exit_code == 0, result.output
    summary = json.loads((db / "_bulkembed" / "docs" / "summary.json").read_text())
    counts = {k: summary[k] for k in ("docs", "new", "changed", "unchanged", "deleted")}
    assert counts == {"docs": 1002, "new": 1, "changed": 1, "unchanged": 1000, "deleted": 0}
    assert run_cli(tmp_path / "v3", model, tmp_path / "full", *SETTINGS).exit_code == 0
    table, full = _table(db), _by_id(pq.read_table(tmp_path / "full"))
    assert table.column("id").to_pylist() == full.column("id").to_pylist()
    assert table.column("content_hash").equals(full.column("content_hash"))
    np.testing.assert_allclose(
        np.array(table.column("vector").to_pylist()),
        np.array(full.column("dense").to_pylist()),
        atol=1e-6,
    )


def test_overwrite_removes_the_change_set(synced, tmp_path):
    folder, model, _ = synced
    out = tmp_path / "out"
    shutil.copytree(folder / "out-v2", out)
    (out / "_bulkembed" / "changes" / "notes.txt").write_text("not bulkembed's")
    result = run_cli(folder / "v2", model, out, *SETTINGS, "--overwrite")
    assert result.exit_code == 0, result.output
    changes = out / "_bulkembed" / "changes"
    assert sorted(p.name for p in changes.rglob("*") if p.is_file()) == ["notes.txt"]


def test_an_unfinished_sync_with_other_inputs_is_refused_naming_the_table(
    synced, lance_v1, tmp_path, monkeypatch
):
    from bulkembed.sinks.lance_sync import TableMerge

    folder, model, _ = synced
    db = tmp_path / "db"
    shutil.copytree(lance_v1, db)
    uri = f"lancedb://{db}?table=docs"
    commit = TableMerge.commit

    def fail_after_the_first_unit(self, part, label):
        if part != "part-00000-000000":
            raise OSError(28, "No space left on device")
        return commit(self, part, label)

    with monkeypatch.context() as patched:
        patched.setattr(TableMerge, "commit", fail_after_the_first_unit)
        failed = run_cli(folder / "v2", model, uri, *SETTINGS, "--since", uri)
    assert failed.exit_code == 1
    corpus = tmp_path / "v3"
    shutil.copytree(folder / "v2", corpus)
    with open(corpus / "b.jsonl", "a") as f:
        f.write(json.dumps({"id": "new-v3", "text": "one more document"}) + "\n")
    refused = run_cli(corpus, model, uri, *SETTINGS, "--since", uri)
    assert refused.exit_code == 1
    assert refused.stderr.startswith(
        f"error: the sync of {uri} holds a run with other settings (the inputs ("
    ), refused.stderr
    again = run_cli(corpus, model, uri, *SETTINGS, "--since", uri, "--overwrite")
    assert again.exit_code == 0, again.output
    assert _table(db).num_rows == 1000 + 3 - 2 + 1

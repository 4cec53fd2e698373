"""LanceDB output: the table matches the Parquet output, self-search, indexes, exactly once."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import sample_texts, write_jsonl, write_parquet
from typer.testing import CliRunner

from bulkembed.cli import app
from bulkembed.contracts import UnitRecord
from bulkembed.errors import OutputError
from bulkembed.sinks import LanceSink, parse_output
from bulkembed.sinks import lance as lance_module

lancedb = pytest.importorskip("lancedb")
HARNESS = Path(__file__).with_name("fault_harness.py")


def _corpus(tmp_path, n=120):
    """`n` records over three shards and many units, with a title column."""
    records = [
        {"id": f"doc-{i}", "text": t, "title": f"title {i}"} for i, t in enumerate(sample_texts(n))
    ]
    third = n // 3
    write_parquet(tmp_path / "corpus" / "a.parquet", records[:third], row_group_size=7)
    write_parquet(tmp_path / "corpus" / "b.parquet", records[third : 2 * third], row_group_size=9)
    write_jsonl(tmp_path / "corpus" / "c.jsonl", records[2 * third :])
    return tmp_path / "corpus", records


def _arguments(corpus, model, out, *extra):
    return [
        "run", str(corpus), "--model", str(model), "--output", str(out), "--quiet",
        "--tokenize-workers", "0", "--max-batch-tokens", "512", *extra,
    ]  # fmt: skip


def _succeed(*arguments):
    """Run the CLI with `arguments`, which must succeed."""
    result = CliRunner().invoke(app, list(map(str, arguments)))
    assert result.exit_code == 0, result.output
    return result


def _by_id(table: pa.Table) -> pa.Table:
    return table.take(pa.array(np.argsort(table.column("id").to_pylist()), pa.int64()))


def test_table_holds_what_the_parquet_output_holds_and_finds_each_document(tmp_path, tiny_bge_m3):
    corpus, records = _corpus(tmp_path)
    common = ("--keep-columns", "title,text")
    _succeed(*_arguments(corpus, tiny_bge_m3, tmp_path / "parquet", *common))
    _succeed(*_arguments(corpus, tiny_bge_m3, f"lancedb://{tmp_path / 'db'}?table=docs", *common))
    table = lancedb.connect(tmp_path / "db").open_table("docs")
    assert table.count_rows() == len(records)
    assert table.schema.names == [
        "id", "vector", "sparse", "multivector", "content_hash", "title", "text",
    ]  # fmt: skip
    lance = _by_id(table.to_arrow())
    parquet = _by_id(pq.read_table(tmp_path / "parquet"))
    assert lance.column("id").to_pylist() == sorted(r["id"] for r in records)
    assert lance.column("vector").to_pylist() == parquet.column("dense").to_pylist()
    for name in ("sparse", "multivector", "content_hash", "title", "text"):
        assert lance.column(name).to_pylist() == parquet.column(name).to_pylist(), name
    for row in range(0, len(records), 10):
        vector = lance.column("vector")[row].as_py()
        hits = table.search(vector, vector_column_name="vector").limit(1).to_arrow()
        found = hits.column("id")[0].as_py()
        assert found == lance.column("id")[row].as_py()


def test_index_and_full_text_index_are_built_at_the_end(tmp_path, tiny_st):
    corpus, records = _corpus(tmp_path, n=300)
    out = f"lancedb://{tmp_path / 'db'}"
    _succeed(
        *_arguments(corpus, tiny_st("mean"), out, "--keep-columns", "text", "--index", "--fts")
    )
    table = lancedb.connect(tmp_path / "db").open_table("embeddings")
    indices = {i.name: i.index_type for i in table.list_indices()}
    assert indices == {"vector_idx": "IvfHnswSq", "text_idx": "FTS"}
    hits = table.search(records[42]["text"], query_type="fts").limit(1).to_arrow()
    assert hits.column("id")[0].as_py() == "doc-42"


def test_index_settings_follow_the_row_count():
    auto = lance_module.IndexSettings()
    assert auto.choose(300) == ("ivf_hnsw_sq", 1)
    assert auto.choose(5_000_000) == ("ivf_pq", 2236)
    assert auto.choose(2_000) == ("ivf_hnsw_sq", 1)
    assert lance_module.IndexSettings("ivf_flat").choose(10_000) == ("ivf_flat", 39)
    assert lance_module.IndexSettings("ivf_pq", partitions=8).choose(10) == ("ivf_pq", 8)


def test_rows_of_an_unfinished_unit_are_taken_back(tmp_path, monkeypatch):
    """A unit whose rows reached the table in several appends, then a crash: the next
    reconcile restores the table to the last committed unit."""
    monkeypatch.setattr(lance_module, "FLUSH_BYTES", 1)
    schema = pa.schema([pa.field("id", pa.string(), nullable=False), pa.field("n", pa.int64())])

    def rows(*ids):
        return pa.RecordBatch.from_pydict({"id": list(ids), "n": [len(i) for i in ids]}, schema)

    sink = LanceSink(tmp_path / "db", "t")
    sink.reconcile({}, "run")
    sink.start(schema)
    sink.write("part-a", rows("a1", "a2"))
    done = {"part-a": UnitRecord("part-a", 2, 0, 0, 0, 0, **sink.commit("part-a", {}))}
    sink.write("part-b", rows("b1"))
    sink.write("part-b", rows("b2"))
    table = lancedb.connect(tmp_path / "db").open_table("t")
    assert table.count_rows() == 4  # the crash comes here: part-b is not committed

    again = LanceSink(tmp_path / "db", "t")
    assert again.reconcile(done, "run").lost == []
    assert sorted(again.committed_ids(done)) == ["a1", "a2"]
    again.start(schema)
    again.write("part-b", rows("b1", "b2"))
    again.commit("part-b", {})
    ids = lancedb.connect(tmp_path / "db").open_table("t").to_arrow().column("id").to_pylist()
    assert sorted(ids) == ["a1", "a2", "b1", "b2"]


def test_empty_units_sharing_a_version_are_not_taken_for_a_lost_marker(tmp_path):
    """part-2 adds rows; part-1, committed after it with no rows, shares its version and
    sorts before it by name."""
    schema = pa.schema([pa.field("id", pa.string(), nullable=False)])
    sink = LanceSink(tmp_path / "db", "t")
    sink.reconcile({}, "run")
    sink.start(schema)
    sink.write("part-2", pa.RecordBatch.from_pydict({"id": ["x"]}, schema))
    done = {"part-2": UnitRecord("part-2", 1, 0, 0, 0, 0, **sink.commit("part-2", {}))}
    done["part-1"] = UnitRecord("part-1", 0, 0, 0, 0, 0, **sink.commit("part-1", {}))
    assert done["part-1"].version == done["part-2"].version
    again = LanceSink(tmp_path / "db", "t")
    assert again.reconcile(dict(sorted(done.items())), "run").lost == []
    assert sorted(again.committed_ids(done)) == ["x"]


def test_a_lost_marker_in_the_middle_takes_the_table_back_to_the_unit_before_it(tmp_path):
    """Units a, b, c, d committed; b's marker is lost. The rows at c's and d's versions are
    more than their markers account for: the table goes back to a's version, and c and d
    are forgotten, to be written again with b."""
    schema = pa.schema([pa.field("id", pa.string(), nullable=False)])
    sink = LanceSink(tmp_path / "db", "t")
    sink.reconcile({}, "run")
    sink.start(schema)
    done = {}
    for unit, ids in [("a", ["a1"]), ("b", ["b1", "b2"]), ("c", ["c1"]), ("d", ["d1", "d2"])]:
        sink.write(f"part-{unit}", pa.RecordBatch.from_pydict({"id": ids}, schema))
        found = sink.commit(f"part-{unit}", {})
        done[f"part-{unit}"] = UnitRecord(f"part-{unit}", len(ids), 0, 0, 0, 0, **found)
    del done["part-b"]

    again = LanceSink(tmp_path / "db", "t")
    assert again.reconcile(done, "run").lost == ["part-c", "part-d"]
    assert sorted(again.committed_ids(done)) == ["a1"]
    assert lancedb.connect(tmp_path / "db").open_table("t").count_rows() == 1


def test_a_table_bulkembed_did_not_write_is_left_alone(tmp_path, tiny_st):
    db = lancedb.connect(tmp_path / "db")
    db.create_table("docs", data=[{"id": "x", "vector": [0.0, 1.0]}])
    corpus, _ = _corpus(tmp_path, n=9)
    arguments = _arguments(corpus, tiny_st("mean"), f"lancedb://{tmp_path / 'db'}?table=docs")
    result = CliRunner().invoke(app, arguments)
    assert result.exit_code == 1
    assert "holds a table 'docs' that bulkembed did not write" in result.output
    assert db.open_table("docs").count_rows() == 1


def test_output_urls_are_parsed_and_checked(tmp_path):
    target = parse_output(f"lancedb://{tmp_path}/db?table=news")
    assert (target.kind, target.path, target.table) == ("lancedb", tmp_path / "db", "news")
    assert target.run_directory == tmp_path / "db" / "_bulkembed" / "news"
    assert parse_output("lancedb://db").table == "embeddings"
    assert parse_output("-").kind == "stdout"
    with pytest.raises(Exception, match="write lancedb://PATH or lancedb://PATH\\?table=NAME"):
        parse_output("lancedb://db?tabel=x")
    for name in ("a/b", "..", ".", ""):
        with pytest.raises(Exception, match="a table name is a plain name of letters"):
            parse_output(f"lancedb://db?table={name}")


def test_status_reports_a_lancedb_run(tmp_path, tiny_st):
    corpus, records = _corpus(tmp_path, n=30)
    out = f"lancedb://{tmp_path / 'db'}?table=docs"
    _succeed(*_arguments(corpus, tiny_st("mean"), out))
    result = CliRunner().invoke(app, ["status", out])
    assert result.exit_code == 0, result.output
    assert "complete" in result.output and " 30 " in result.output


@pytest.mark.slow
@pytest.mark.parametrize(("stage", "n"), [("append", 3), ("append", 9), ("marked", 5)])
def test_sigkill_then_rerun_leaves_each_id_once(tmp_path, tiny_bge_m3, stage, n):
    corpus, records = _corpus(tmp_path)
    out = f"lancedb://{tmp_path / 'db'}?table=docs"
    arguments = _arguments(corpus, tiny_bge_m3, out)
    command = [sys.executable, str(HARNESS), stage, str(n), "SIGKILL", "--", *arguments]
    killed = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -9, killed.stderr
    table = lancedb.connect(tmp_path / "db").open_table("docs")
    assert 0 < table.count_rows() < len(records)
    _succeed(*arguments)
    _succeed(*_arguments(corpus, tiny_bge_m3, tmp_path / "reference"))
    lance = _by_id(lancedb.connect(tmp_path / "db").open_table("docs").to_arrow())
    ids = lance.column("id").to_pylist()
    assert ids == sorted(r["id"] for r in records)  # each id once, none missing
    reference = _by_id(pq.read_table(tmp_path / "reference"))
    vectors = np.array(lance.column("vector").to_pylist())
    expected = np.array(reference.column("dense").to_pylist())
    np.testing.assert_allclose(vectors, expected, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["compacted", "indexed"])
def test_sigkill_while_finishing_an_indexed_table_then_rerun_gives_each_id_once_and_the_index(
    tmp_path, tiny_st, stage
):
    corpus, records = _corpus(tmp_path, n=300)
    out = f"lancedb://{tmp_path / 'db'}?table=docs"
    arguments = _arguments(corpus, tiny_st("mean"), out, "--index")
    command = [sys.executable, str(HARNESS), stage, "1", "SIGKILL", "--", *arguments]
    killed = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -9, killed.stderr
    _succeed(*arguments)
    table = lancedb.connect(tmp_path / "db").open_table("docs")
    ids = table.to_arrow().column("id").to_pylist()
    assert sorted(ids) == sorted(r["id"] for r in records)  # each id once, none missing
    assert [i.name for i in table.list_indices()] == ["vector_idx"]
    status = CliRunner().invoke(app, ["status", out, "--json"])
    assert json.loads(status.stdout)["state"] == "complete"


def test_lancedb_options_need_a_lancedb_output(tmp_path, tiny_st):
    corpus, _ = _corpus(tmp_path, n=9)
    result = CliRunner().invoke(app, _arguments(corpus, tiny_st("mean"), tmp_path / "o", "--index"))
    assert result.exit_code == 1
    assert "--index and --fts apply to --output lancedb://... only" in result.output
    with pytest.raises(OutputError, match="LanceDB needs a directory"):
        (tmp_path / "file").write_text("x")
        LanceSink(tmp_path / "file").check_foreign(overwrite=True)


def test_a_finished_table_reruns_as_nothing_to_do(tmp_path, tiny_st):
    corpus, records = _corpus(tmp_path, n=300)
    arguments = _arguments(corpus, tiny_st("mean"), f"lancedb://{tmp_path / 'db'}", "--index")
    _succeed(*arguments)
    again = CliRunner().invoke(app, [a for a in map(str, arguments) if a != "--quiet"])
    assert again.exit_code == 0, again.output
    assert "nothing to do" in again.output
    table = lancedb.connect(tmp_path / "db").open_table("embeddings")
    assert table.count_rows() == len(records)
    assert [i.name for i in table.list_indices()] == ["vector_idx"]


def test_a_run_stopped_while_indexing_finishes_on_rerun(tmp_path, tiny_st, monkeypatch):
    from bulkembed.errors import Interrupted

    corpus, records = _corpus(tmp_path, n=300)
    arguments = _arguments(corpus, tiny_st("mean"), f"lancedb://{tmp_path / 'db'}", "--index")

    def stopped(*args):
        raise Interrupted(2, "stopped by SIGINT: run the same command again to resume")

    monkeypatch.setattr(lance_module, "_index_config", stopped)
    first = CliRunner().invoke(app, list(map(str, arguments)))
    assert first.exit_code == 130, first.output
    monkeypatch.undo()
    _succeed(*arguments)
    table = lancedb.connect(tmp_path / "db").open_table("embeddings")
    ids = table.to_arrow().column("id").to_pylist()
    assert sorted(ids) == sorted(r["id"] for r in records)
    assert [i.name for i in table.list_indices()] == ["vector_idx"]

"""LanceDB output: the table matches the Parquet output, self-search, indexes, exactly once."""

import json
import subprocess
import sys
from dataclasses import asdict, replace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import HARNESS, sample_texts, write_jsonl, write_parquet
from typer.testing import CliRunner

from bulkembed.cli import app
from bulkembed.contracts import UnitRecord, part_name
from bulkembed.errors import OutputError
from bulkembed.run_dir.intents import Intents
from bulkembed.sinks import lance_index, parse_output
from bulkembed.sinks.lance import LanceSink
from bulkembed.sinks.lance_index import IndexSettings

lancedb = pytest.importorskip("lancedb")


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
    auto = IndexSettings()
    assert auto.choose(300) == ("ivf_hnsw_sq", 1)
    assert auto.choose(5_000_000) == ("ivf_pq", 2236)
    assert auto.choose(2_000) == ("ivf_hnsw_sq", 1)
    assert IndexSettings("ivf_flat").choose(10_000) == ("ivf_flat", 39)
    assert IndexSettings("ivf_pq", partitions=8).choose(10) == ("ivf_pq", 8)


SCHEMA = pa.schema([pa.field("id", pa.string(), nullable=False)])


def _sink(tmp_path):
    """A sink on `tmp_path/db`, table `t`, with its intents in `tmp_path/meta`."""
    return LanceSink(tmp_path / "db", "t", intents=Intents(tmp_path / "meta"))


def _write_unit(sink, unit, ids, run="run", commit=True):
    """Write the unit `unit` (its part name, its record) with `ids`; commit it unless not
    `commit`: then its data files are written, and the crash comes before its intent."""
    part = part_name(0, unit)
    record = UnitRecord(part, len(ids), 0, 0, 0, 0)
    sink.write(part, pa.RecordBatch.from_pydict({"id": list(ids)}, SCHEMA))
    if not commit:
        sink._flush()
        return part, record
    found = sink.commit(part, {"run": run, "unit": {**asdict(record), "bad": []}})
    return part, replace(record, **found)


def _write_intent(sink, unit, ids):
    """Write the unit `unit` with `ids` up to its intent; the crash comes before the commit."""
    files = _data_files(sink.path.parent)
    part, record = _write_unit(sink, unit, ids, commit=False)
    written = sorted(set(_data_files(sink.path.parent)) - set(files))
    label = {"run": "run", "unit": {**asdict(record), "bad": []}}
    sink.intents.write(part, {"files": written, "label": label})


def _table_ids(tmp_path):
    return sorted(lancedb.connect(tmp_path / "db").open_table("t").to_arrow()["id"].to_pylist())


def _data_files(tmp_path):
    return sorted(p.name for p in (tmp_path / "db" / "t.lance" / "data").iterdir())


def test_a_committed_unit_without_its_marker_is_kept_and_an_uncommitted_one_dropped(tmp_path):
    """Unit 0 committed and marked, unit 1 committed (its marker not written), unit 2
    written up to its intent, not committed: the crash comes there."""
    sink = _sink(tmp_path)
    sink.reconcile({}, "run")
    sink.start(SCHEMA)
    part0, record0 = _write_unit(sink, 0, ["a1", "a2"])
    part1, record1 = _write_unit(sink, 1, ["b1"])
    files = _data_files(tmp_path)
    _write_intent(sink, 2, ["c1", "c2"])
    assert len(_data_files(tmp_path)) == len(files) + 1

    again = _sink(tmp_path)
    recovered = again.reconcile({part0: record0}, "run")
    assert recovered.lost == []
    assert recovered.adopted == [{**asdict(record1), "bad": []}]
    assert _data_files(tmp_path) == files
    both = again.committed_ids({part0: record0, part1: record1})
    assert sorted(i for a in both for i in a.to_pylist()) == ["a1", "a2", "b1"]
    first = again.committed_ids({part0: record0})
    assert sorted(i for a in first for i in a.to_pylist()) == ["a1", "a2"]
    assert _table_ids(tmp_path) == ["a1", "a2", "b1"]
    # Data files written before their intent are in no table version; `finish` deletes them.
    again.start(SCHEMA)
    _write_unit(again, 3, ["d1"], commit=False)
    again._fragments = []
    assert _table_ids(tmp_path) == ["a1", "a2", "b1"]
    assert len(_data_files(tmp_path)) == len(files) + 1
    again.finish()
    assert _table_ids(tmp_path) == ["a1", "a2", "b1"]
    table = lancedb.connect(tmp_path / "db").open_table("t")
    assert len(_data_files(tmp_path)) == len(table.to_lance().get_fragments())


def test_a_committed_unit_of_another_run_is_taken_back_out_of_the_table(tmp_path):
    sink = _sink(tmp_path)
    sink.reconcile({}, "run")
    sink.start(SCHEMA)
    part0, record0 = _write_unit(sink, 0, ["a1"])
    _write_unit(sink, 1, ["b1", "b2"], run="another")
    recovered = _sink(tmp_path).reconcile({part0: record0}, "run")
    assert (recovered.adopted, recovered.lost) == ([], [])
    assert _table_ids(tmp_path) == ["a1"]
    assert Intents(tmp_path / "meta").read(part_name(0, 1)) is None


def test_a_done_unit_whose_rows_were_deleted_is_lost(tmp_path):
    sink = _sink(tmp_path)
    sink.reconcile({}, "run")
    sink.start(SCHEMA)
    done = dict([_write_unit(sink, 0, ["a1"]), _write_unit(sink, 1, ["b1"])])
    lancedb.connect(tmp_path / "db").open_table("t").delete("id = 'b1'")
    assert _sink(tmp_path).reconcile(done, "run").lost == [part_name(0, 1)]


def test_a_unit_written_again_after_its_writer_was_lost_is_in_the_table_once(tmp_path):
    """A writer committed unit 0 and was lost before the unit was marked done; another
    writes the unit again."""
    first, second = _sink(tmp_path), _sink(tmp_path)
    first.reconcile({}, "run")
    first.start(SCHEMA)
    second.start(SCHEMA)
    _write_unit(first, 0, ["a1", "a2"])
    files = _data_files(tmp_path)
    _write_unit(second, 0, ["a1", "a2"])
    assert _table_ids(tmp_path) == ["a1", "a2"]
    assert _data_files(tmp_path) == files
    # Written up to its intent, then lost: the next writer's files replace its files.
    _write_intent(first, 1, ["b1"])
    _write_unit(second, 1, ["b1"])
    assert _table_ids(tmp_path) == ["a1", "a2", "b1"]
    assert len(_data_files(tmp_path)) == len(files) + 1


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
    assert (target.kind, target.path, target.name) == ("lancedb", tmp_path / "db", "news")
    assert target.run_directory == tmp_path / "db" / "_bulkembed" / "news"
    assert parse_output("lancedb://db").name == "embeddings"
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
    assert result.exit_code == 2
    assert "--index and --fts apply to an output that keeps indexes" in result.output
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

    monkeypatch.setattr(lance_index, "_index_config", stopped)
    first = CliRunner().invoke(app, list(map(str, arguments)))
    assert first.exit_code == 130, first.output
    monkeypatch.undo()
    _succeed(*arguments)
    table = lancedb.connect(tmp_path / "db").open_table("embeddings")
    ids = table.to_arrow().column("id").to_pylist()
    assert sorted(ids) == sorted(r["id"] for r in records)
    assert [i.name for i in table.list_indices()] == ["vector_idx"]


def test_a_shard_that_reads_the_ledger_before_another_compacts_goes_on(
    tmp_path, tiny_st, monkeypatch
):
    from bulkembed.run_dir.ledger import Ledger

    corpus, _ = _corpus(tmp_path, n=90)
    out = f"lancedb://{tmp_path / 'db'}"
    for shard in range(3):
        _succeed(*_arguments(corpus, tiny_st("mean"), out, "--shard", f"{shard}/3"))
    table = lancedb.connect(tmp_path / "db").open_table("embeddings")
    assert table.count_rows() == 90
    # The shard starts before the last one marks the output complete.
    (tmp_path / "db" / "_bulkembed" / "embeddings" / "complete").unlink()
    units = Ledger.units
    reads = []

    def read_before_the_others_marked(ledger):
        # The first read finds no unit done: the other shards marked theirs (and the last
        # one compacted the table) just after this shard read the ledger.
        done, damaged = units(ledger)
        reads.append(len(done))
        return ({}, damaged) if len(reads) == 1 else (done, damaged)

    monkeypatch.setattr(Ledger, "units", read_before_the_others_marked)
    again = CliRunner().invoke(app, _arguments(corpus, tiny_st("mean"), out, "--shard", "0/3"))
    assert again.exit_code == 0, again.output
    assert len(reads) >= 2
    assert table.count_rows() == 90


def test_a_quiet_lancedb_run_prints_nothing(tmp_path, tiny_st):
    # OpenVINO forks a process of its own at import: LanceDB must not warn of it.
    corpus, _ = _corpus(tmp_path, n=9)
    out = f"lancedb://{tmp_path / 'db'}?table=docs"
    command = [sys.executable, "-m", "bulkembed", *_arguments(corpus, tiny_st("mean"), out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert (result.stdout, result.stderr) == ("", "")


def test_ids_read_while_another_run_compacts_the_table_are_read_from_the_compacted_one(tmp_path):
    """A `--shard` run reads the table's ids as the run that finishes the table compacts it
    and deletes the files the read began on: the read goes on in the compacted table."""
    sink = _sink(tmp_path)
    sink.reconcile({}, "run")
    sink.start(SCHEMA)
    done = dict(_write_unit(sink, unit, [f"u{unit}-{i}" for i in range(3)]) for unit in range(4))
    reader = _sink(tmp_path).committed_ids(done)
    ids = next(reader).to_pylist()
    sink.finish()
    assert len(_data_files(tmp_path)) == 1
    ids += [i for array in reader for i in array.to_pylist()]
    assert set(ids) == {f"u{unit}-{i}" for unit in range(4) for i in range(3)}


def test_an_indexed_sync_and_a_users_text_search_print_no_third_party_warning(tmp_path, tiny_st):
    import os
    import subprocess
    import sys

    corpus, records = _corpus(tmp_path, n=300)
    model = tiny_st("mean")
    out = f"lancedb://{tmp_path / 'db'}?table=docs"
    environment = {
        k: v for k, v in os.environ.items() if k not in ("LANCE_INCLUDE_VECTOR_CENTROIDS", "CI")
    }
    environment["HF_HUB_OFFLINE"] = "1"
    command = [sys.executable, "-m", "bulkembed", *_arguments(corpus, model, out)]
    command += ["--keep-columns", "text", "--index"]
    first = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    records[0]["text"] = "an edited text about sorting lists"
    write_parquet(corpus / "a.parquet", records[:100], row_group_size=7)
    synced = subprocess.run(
        [*command, "--since", out], env=environment, capture_output=True, text=True, timeout=300
    )
    assert synced.returncode == 0, synced.stderr
    assert synced.stderr == "", synced.stderr
    script = (
        "import lancedb\n"
        "import bulkembed.lancedb  # noqa: F401\n"
        f"table = lancedb.connect({str(tmp_path / 'db')!r}).open_table('docs')\n"
        "print(table.search('sorting lists').limit(1).to_list()[0]['id'])\n"
    )
    environment["BULKEMBED_DEVICE"] = "cpu"
    search = subprocess.run(
        [sys.executable, "-c", script], env=environment, capture_output=True, text=True, timeout=300
    )
    assert search.returncode == 0, search.stderr
    assert search.stdout.strip() in {r["id"] for r in records} and search.stderr == ""

"""bulkembed never deletes or overwrites what it did not write, and a damaged ledger never
turns into a silently incomplete output."""

import json
import shutil

import pyarrow.parquet as pq
import pytest
from helpers import (
    read_output,
    records,
    run_cli,
    status_of,
    write_corpus,
)
from typer.testing import CliRunner

from bulkembed.cli import app
from bulkembed.run_dir import RunDirectory

runner = CliRunner()

# float32 on every CPU, so that vectors compare at float32 precision across runs.
FLOAT32 = ("--dtype", "float32")


def _corpus(tmp_path, n=40):
    """`n` records: half in a Parquet file of 10-row units, half in a JSONL file (one unit),
    with null texts (bad records) at 3 and 14."""
    texts = records(n)
    for record in texts[3:15:11]:
        record["text"] = None
    return write_corpus(tmp_path, texts, n // 2, row_group_size=10), texts


def _summary(out):
    return json.loads((out / "_bulkembed" / "summary.json").read_text())


def _tree(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


# --overwrite and foreign files.


def test_a_table_name_that_leaves_the_database_folder_is_refused_and_nothing_is_removed(
    tmp_path, tiny_st
):
    pytest.importorskip("lancedb")
    corpus, _ = _corpus(tmp_path, 10)
    db = tmp_path / "db"
    assert (
        run_cli(corpus, tiny_st("mean"), f"lancedb://{db}?table=precious", *FLOAT32).exit_code == 0
    )
    (db / "notes.txt").write_text("mine")
    (db / "mydata").mkdir()
    (db / "mydata" / "keep.txt").write_text("mine too")
    before = _tree(db)
    for name in ("..", "."):
        result = run_cli(
            corpus, tiny_st("mean"), f"lancedb://{db}?table={name}", "--overwrite", *FLOAT32
        )
        assert _tree(db) == before
        assert result.exit_code == 2
        assert result.stderr.strip() == (
            f"error: --output lancedb://{db}?table={name}: a table name is a plain name of "
            "letters, digits, '_', '-' and '.' (not '.' or '..')"
        )
    assert _tree(db) == before


def test_overwrite_of_a_lancedb_table_keeps_other_tables_and_the_users_files(tmp_path, tiny_st):
    lancedb = pytest.importorskip("lancedb")
    corpus, records = _corpus(tmp_path, 10)
    db = tmp_path / "db"
    for table in ("one", "two"):
        assert (
            run_cli(corpus, tiny_st("mean"), f"lancedb://{db}?table={table}", *FLOAT32).exit_code
            == 0
        )
    (db / "notes.txt").write_text("mine")
    (db / "_bulkembed" / "one" / "mine.txt").write_text("mine")
    overwritten = run_cli(
        corpus, tiny_st("cls"), f"lancedb://{db}?table=one", "--overwrite", *FLOAT32
    )
    assert overwritten.exit_code == 0, overwritten.output
    assert (db / "notes.txt").read_text() == "mine"
    assert (db / "_bulkembed" / "one" / "mine.txt").read_text() == "mine"
    assert lancedb.connect(db).open_table("two").count_rows() == 9
    assert RunDirectory(db, db / "_bulkembed" / "two").is_complete()


def test_a_file_named_like_a_part_in_a_directory_bulkembed_did_not_make_is_kept(tmp_path, tiny_st):
    corpus, _ = _corpus(tmp_path, 10)
    out = tmp_path / "out"
    out.mkdir()
    (out / "part-00007-000042.parquet").write_text("not mine to delete")
    for extra in ((), ("--overwrite",)):
        result = run_cli(corpus, tiny_st("mean"), out, *extra, *FLOAT32)
        assert result.exit_code == 1
        assert result.stderr.strip() == (
            f"error: {out / 'part-00007-000042.parquet'} is named like a part of this output "
            "but this run of bulkembed did not write it: move it away (bulkembed never deletes "
            "or overwrites a file it did not write)"
        )
    assert (out / "part-00007-000042.parquet").read_text() == "not mine to delete"


def test_overwrite_removes_only_bulkembeds_own_parts_and_run_files(tmp_path, tiny_st):
    corpus, records = _corpus(tmp_path, 20)
    out = tmp_path / "out"
    out.mkdir()
    (out / "README.md").write_text("mine")
    refused = run_cli(corpus, tiny_st("mean"), out, *FLOAT32)
    assert refused.exit_code == 1 and "(README.md)" in refused.stderr
    assert run_cli(corpus, tiny_st("mean"), out, "--overwrite", *FLOAT32).exit_code == 0
    (out / "notes.parquet").write_bytes(b"mine")
    (out / "_bulkembed" / "keep.txt").write_text("mine")
    (out / "_bulkembed" / "done" / "keep.txt").write_text("mine")
    assert run_cli(corpus, tiny_st("cls"), out, "--overwrite", *FLOAT32).exit_code == 0
    assert (out / "README.md").read_text() == "mine"
    assert (out / "notes.parquet").read_bytes() == b"mine"
    assert (out / "_bulkembed" / "keep.txt").read_text() == "mine"
    assert (out / "_bulkembed" / "done" / "keep.txt").read_text() == "mine"
    table = pq.read_table(sorted(out.glob("part-*.parquet")))
    assert sorted(table.column("id").to_pylist()) == sorted(
        r["id"] for r in records if r["text"] is not None
    )


def test_an_empty_output_is_refused(tmp_path, tiny_st):
    corpus, _ = _corpus(tmp_path, 10)
    result = run_cli(corpus, tiny_st("mean"), "", *FLOAT32)
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "error: --output is empty: name a directory, lancedb://PATH?table=NAME, or - for stdout"
    )
    assert not list(tmp_path.glob("part-*")) and not (tmp_path / "_bulkembed").exists()


# A damaged ledger.


@pytest.fixture
def finished(tmp_path, tiny_st):
    """A finished Parquet output of 3 units (2 with a bad record), and its contents."""
    corpus, records = _corpus(tmp_path)
    out = tmp_path / "out"
    assert run_cli(corpus, tiny_st("mean"), out, *FLOAT32).exit_code == 0
    bad = (out / "_bulkembed" / "bad_records.jsonl").read_text()
    return corpus, out, read_output(out), bad


def test_a_lost_marker_of_a_finished_output_is_taken_back_from_its_part(finished, tiny_st):
    corpus, out, expected, bad = finished
    run = RunDirectory(out)
    marker = run.done_dir / "part-00000-000000.json"
    before = marker.read_text()
    marker.unlink()
    result = run_cli(corpus, tiny_st("mean"), out, *FLOAT32)
    assert result.exit_code == 0, result.output
    assert read_output(out) == expected
    assert "part-00000-000000: its done-marker was missing or damaged; the part is complete" in (
        result.stderr
    )
    assert marker.read_text() == before
    assert (out / "_bulkembed" / "bad_records.jsonl").read_text() == bad
    assert status_of(out)["state"] == "complete" and status_of(out)["docs"] == 38


def test_a_damaged_marker_is_taken_back_from_its_part(finished, tiny_st):
    corpus, out, expected, bad = finished
    marker = RunDirectory(out).done_dir / "part-00000-000001.json"
    marker.write_text(marker.read_text()[:20])
    (out / "_bulkembed" / "complete").unlink()
    result = run_cli(corpus, tiny_st("mean"), out, *FLOAT32)
    assert result.exit_code == 0, result.output
    assert _summary(out)["docs_this_run"] == 0 and _summary(out)["docs"] == 38
    assert read_output(out) == expected
    assert (out / "_bulkembed" / "bad_records.jsonl").read_text() == bad


def test_a_part_deleted_by_hand_is_embedded_again_and_the_output_is_not_complete_before(
    finished, tiny_st
):
    corpus, out, expected, bad = finished
    (out / "part-00000-000001.parquet").unlink()
    status = status_of(out)
    assert status["state"] != "complete" and status["units_pending"] == 1
    result = run_cli(corpus, tiny_st("mean"), out, *FLOAT32)
    assert result.exit_code == 0, result.output
    assert "part-00000-000001: its rows are missing from" in result.stderr
    assert _summary(out)["docs_this_run"] == 9
    assert read_output(out).keys() == expected.keys()
    assert (out / "_bulkembed" / "bad_records.jsonl").read_text() == bad
    assert status_of(out)["state"] == "complete"


@pytest.mark.parametrize("marker", ["deleted", "damaged"])
def test_a_unit_that_lost_both_its_marker_and_its_part_is_embedded_again(finished, tiny_st, marker):
    corpus, out, expected, bad = finished
    path = RunDirectory(out).done_dir / "part-00000-000001.json"
    if marker == "deleted":
        path.unlink()
    else:
        path.write_text("{")
    (out / "part-00000-000001.parquet").unlink()
    status = status_of(out)
    assert status["state"] != "complete" and status["units_done"] == 2
    result = run_cli(corpus, tiny_st("mean"), out, *FLOAT32)
    assert result.exit_code == 0, result.output
    assert _summary(out)["docs_this_run"] == 9
    assert read_output(out).keys() == expected.keys()
    assert (out / "_bulkembed" / "bad_records.jsonl").read_text() == bad
    assert status_of(out)["state"] == "complete"


def test_a_damaged_part_is_refused_naming_it(finished, tiny_st):
    corpus, out, _, _ = finished
    part = out / "part-00000-000001.parquet"
    part.write_bytes(part.read_bytes()[:100])
    result = run_cli(corpus, tiny_st("mean"), out, *FLOAT32)
    assert result.exit_code == 1
    line = result.stderr.strip()
    assert line.startswith(f"error: {part} is damaged (")
    assert line.endswith("delete it to have its unit embedded again, or use --overwrite")
    assert len(line.splitlines()) == 1 and part.exists()
    # The output was finished: the run that found it damaged is what `status` reports.
    shown = CliRunner().invoke(app, ["status", str(out), "--json"])
    status = json.loads(shown.stdout)
    assert (shown.exit_code, status["state"]) == (65, "damaged")
    assert status["message"].startswith(f"failed with exit status 1: {part} is damaged (")
    part.unlink()
    assert run_cli(corpus, tiny_st("mean"), out, *FLOAT32).exit_code == 0
    status = json.loads(CliRunner().invoke(app, ["status", str(out), "--json"]).stdout)
    assert status["state"] == "complete"


def test_a_part_of_another_output_is_refused_not_taken_in(finished, tiny_st, tmp_path):
    corpus, out, _, _ = finished
    other = tmp_path / "other"
    assert run_cli(corpus, tiny_st("mean"), other, *FLOAT32).exit_code == 0
    (out / "_bulkembed" / "done" / "part-00001-000000.json").unlink()
    shutil.copy(other / "part-00001-000000.parquet", out / "part-00001-000000.parquet")
    result = run_cli(corpus, tiny_st("mean"), out, *FLOAT32)
    assert result.exit_code == 1
    assert "part-00001-000000.parquet is named like a part of this output but this run" in (
        result.stderr
    )


def test_a_part_whose_bad_records_were_too_many_for_its_footer_is_not_taken_back(
    tmp_path, tiny_st, monkeypatch
):
    monkeypatch.setattr("bulkembed.engine.writer.LABEL_BAD_RECORDS_BYTES", 10)
    corpus, _ = _corpus(tmp_path)
    out = tmp_path / "out"
    assert run_cli(corpus, tiny_st("mean"), out, *FLOAT32).exit_code == 0
    label = json.loads(
        pq.read_metadata(out / "part-00000-000000.parquet").metadata[b"bulkembed.unit"]
    )
    assert label["unit"]["bad"] is None and label["unit"]["bad_records"] == 1
    (out / "_bulkembed" / "done" / "part-00000-000000.json").unlink()
    result = run_cli(corpus, tiny_st("mean"), out, *FLOAT32)
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        f"error: {out / 'part-00000-000000.parquet'} has no done-marker, and it had too many "
        "bad records to keep them in its footer: delete it to have its unit embedded again"
    )
    (out / "part-00000-000000.parquet").unlink()
    assert run_cli(corpus, tiny_st("mean"), out, *FLOAT32).exit_code == 0
    assert _summary(out)["docs_this_run"] == 9 and _summary(out)["bad_records"] == 2


def test_a_shard_leaves_the_markers_of_other_shards_alone(tmp_path):
    """A marker another shard is writing may look damaged for an instant: only a shard's
    own units are ever forgotten."""
    from bulkembed.config import ShardSpec
    from bulkembed.sinks.parquet import ParquetSink

    run = RunDirectory(tmp_path / "out", shard=ShardSpec(0, 2))
    run.done_dir.mkdir(parents=True)
    run.config_path.write_text(json.dumps({"run": "r"}))
    (run.done_dir / "part-00000-000001.json").write_text("{")
    assert run.reconcile(ParquetSink(tmp_path / "out"), mine={"part-00000-000000"}) == {}
    assert (run.done_dir / "part-00000-000001.json").read_text() == "{"
    assert run.repairs == []


def test_a_lancedb_output_that_lost_its_configuration_can_be_overwritten(tmp_path, tiny_st):
    lancedb = pytest.importorskip("lancedb")
    corpus, records = _corpus(tmp_path, 10)
    db = tmp_path / "db"
    assert run_cli(corpus, tiny_st("mean"), f"lancedb://{db}?table=t", *FLOAT32).exit_code == 0
    (db / "_bulkembed" / "t" / "config.json").unlink()
    refused = run_cli(corpus, tiny_st("mean"), f"lancedb://{db}?table=t", *FLOAT32)
    assert refused.exit_code == 1 and "config.json is missing but 2 units" in refused.stderr
    again = run_cli(corpus, tiny_st("mean"), f"lancedb://{db}?table=t", "--overwrite", *FLOAT32)
    assert again.exit_code == 0, again.output
    assert lancedb.connect(db).open_table("t").count_rows() == 9


def test_a_lost_quarantine_file_is_rebuilt_from_the_markers(finished, tiny_st):
    corpus, out, expected, bad = finished
    assert len(bad.splitlines()) == 2
    (out / "_bulkembed" / "bad_records.jsonl").unlink()
    assert run_cli(corpus, tiny_st("mean"), out, *FLOAT32).exit_code == 0
    assert (out / "_bulkembed" / "bad_records.jsonl").read_text() == bad


def test_a_lost_configuration_is_refused_while_units_are_marked_done(finished, tiny_st):
    corpus, out, _, _ = finished
    (out / "_bulkembed" / "config.json").unlink()
    result = run_cli(corpus, tiny_st("mean"), out, *FLOAT32)
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        f"error: {out / '_bulkembed' / 'config.json'} is missing but 3 units are marked done: "
        "the settings they were embedded with are unknown; pass --overwrite to start over"
    )

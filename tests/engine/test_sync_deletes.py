"""What a sync may delete: an id is gone only when the input that held it was read whole
and no longer holds it, or that input is no longer listed. Damaged inputs keep their
previous rows, a run over its bad-record limit deletes nothing, and `--max-deletes` stops
a mass delete. For LanceDB tables synced in place and Parquet `--since` change sets, over
Parquet and JSON-lines inputs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from helpers import run_cli, sample_texts, write_jsonl, write_parquet
from typer.testing import CliRunner

from bulkembed.cli import app

SETTINGS = ("--dtype", "float32", "--max-length", "24")
FILES = 5
PER_FILE = 100
DAMAGES = ("cut", "malformed", "null-text", "emptied", "no-input")
# Exit statuses: done, too many bad records, too many deletes, usage error.
DONE, BAD, DELETES, USAGE = 0, 3, 4, 2


def _records(file: int) -> list[dict]:
    texts = sample_texts(FILES * PER_FILE)[file * PER_FILE : (file + 1) * PER_FILE]
    return [{"id": f"f{file}-{i}", "text": t} for i, t in enumerate(texts)]


def _write(folder: Path, kind: str, file: int, records: list[dict]) -> Path:
    if kind == "parquet":
        return write_parquet(folder / f"f{file}.parquet", records, row_group_size=50)
    return write_jsonl(folder / f"f{file}.jsonl", records)


def _corpus(folder: Path, kind: str) -> Path:
    for file in range(FILES):
        _write(folder, kind, file, _records(file))
    return folder


def _by_id(table: pa.Table) -> pa.Table:
    return table.take(pc.sort_indices(table, [("id", "ascending")]))


def _table(db: Path) -> pa.Table:
    import lancedb

    table = lancedb.connect(db).open_table("docs").to_arrow()
    return _by_id(
        table.rename_columns(["dense" if n == "vector" else n for n in table.schema.names])
    )


@pytest.fixture(scope="module")
def previous(tmp_path_factory, tiny_st):
    """For each input kind: its corpus, a Parquet output of it and a LanceDB table of it."""
    folder = tmp_path_factory.mktemp("deletes")
    model = tiny_st("mean")
    made = {}
    for kind in ("parquet", "jsonl"):
        corpus = _corpus(folder / f"corpus-{kind}", kind)
        out, db = folder / f"out-{kind}", folder / f"db-{kind}"
        for target in (out, f"lancedb://{db}?table=docs"):
            result = run_cli(corpus, model, target, *SETTINGS)
            assert result.exit_code == 0, result.output
        made[kind] = (corpus, out, db)
    return model, made


def _copies(previous, tmp_path: Path, kind: str) -> tuple[Path, Path, Path, Path]:
    """The model, a copy of the corpus of `kind`, its Parquet output (to read only) and a
    copy of its LanceDB table."""
    model, made = previous
    source, prev, db = made[kind]
    shutil.copytree(source, tmp_path / "corpus")
    shutil.copytree(db, tmp_path / "db")
    return model, tmp_path / "corpus", prev, tmp_path / "db"


def _deletes(out: Path) -> list:
    """The ids of a change set's `deletes.parquet`, sorted."""
    return sorted(
        pq.read_table(out / "_bulkembed" / "changes" / "deletes.parquet")["id"].to_pylist()
    )


def _summary(meta: Path) -> dict:
    return json.loads((meta / "summary.json").read_text())


def _quarantine(meta: Path) -> list[dict]:
    return [json.loads(line) for line in (meta / "bad_records.jsonl").open()]


def _damage(corpus: Path, kind: str, damage: str) -> None:
    """Damage file f2 of the corpus (or every file, or remove them all)."""
    path = corpus / f"f2.{kind}"
    if damage == "cut":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 3])
    elif damage == "malformed":
        records = _records(2)
        if kind == "jsonl":
            lines = path.read_text().splitlines(keepends=True)
            lines[40] = lines[40][:25] + "\n"
            path.write_text("".join(lines))
        else:
            # A row whose id cannot be read: which id it held is unknown.
            records[40]["id"] = None
            _write(corpus, kind, 2, records)
    elif damage == "null-text":
        records = _records(2)
        records[40]["text"] = None
        _write(corpus, kind, 2, records)
    elif damage == "emptied":
        for file in range(FILES):
            (corpus / f"f{file}.{kind}").write_bytes(b"")
    elif damage == "no-input":
        for file in range(FILES):
            (corpus / f"f{file}.{kind}").unlink()


def _expected_status(kind: str, damage: str, limited: bool) -> int:
    if damage == "no-input":
        return USAGE
    if damage == "emptied" and kind == "jsonl":
        # Every file read whole and empty: 500 deletes, over the default 10%.
        return DELETES
    return BAD if limited else DONE


def _sync(model: Path, corpus: Path, target: str, since: str, *extra: str):
    return run_cli(corpus, model, target, *SETTINGS, "--since", since, *extra)


@pytest.mark.parametrize("limited", [False, True], ids=["no-limit", "max-bad-records-0"])
@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize("kind", ["parquet", "jsonl"])
def test_a_lancedb_sync_keeps_every_row_it_could_not_read(
    previous, tmp_path, kind, damage, limited
):
    model, corpus, prev, db = _copies(previous, tmp_path, kind)
    _damage(corpus, kind, damage)
    before = _table(db)
    uri = f"lancedb://{db}?table=docs"
    extra = ("--max-bad-records", "0") if limited else ()
    result = _sync(model, corpus, uri, uri, *extra)
    assert result.exit_code == _expected_status(kind, damage, limited), result.output
    after = _table(db)
    assert after.column("id").equals(before.column("id"))
    assert after.column("dense").equals(before.column("dense"))
    assert after.column("content_hash").equals(before.column("content_hash"))
    if damage != "no-input":
        summary = _summary(db / "_bulkembed" / "docs")
        assert summary["deleted"] == 0
        assert summary["docs"] == FILES * PER_FILE


@pytest.mark.parametrize("limited", [False, True], ids=["no-limit", "max-bad-records-0"])
@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize("kind", ["parquet", "jsonl"])
def test_a_parquet_change_set_keeps_every_row_it_could_not_read(
    previous, tmp_path, kind, damage, limited
):
    model, corpus, prev, _ = _copies(previous, tmp_path, kind)
    out = tmp_path / "out"
    _damage(corpus, kind, damage)
    extra = ("--max-bad-records", "0") if limited else ()
    result = _sync(model, corpus, str(out), str(prev), *extra)
    assert result.exit_code == _expected_status(kind, damage, limited), result.output
    if damage == "no-input":
        assert not out.exists()
        return
    assert _deletes(out) == []
    new, old = _by_id(pq.read_table(out)), _by_id(pq.read_table(prev))
    assert new.column("id").equals(old.column("id"))
    assert new.column("content_hash").equals(old.column("content_hash"))
    np.testing.assert_allclose(
        np.array(new.column("dense").to_pylist()),
        np.array(old.column("dense").to_pylist()),
        atol=1e-6,
    )
    summary = _summary(out / "_bulkembed")
    assert (summary["docs"], summary["deleted"]) == (FILES * PER_FILE, 0)


def _edit(corpus: Path, removed: tuple[int, ...]) -> None:
    """The next night: files `removed` are gone, f0's first document changed, one added."""
    for file in removed:
        (corpus / f"f{file}.jsonl").unlink()
    records = _records(0)
    records[0]["text"] += " (edited)"
    records.append({"id": "f0-new", "text": "a document added tonight"})
    _write(corpus, "jsonl", 0, records)


def _over_the_limit_message(withheld: int, share: str, limit: str) -> str:
    return (
        f"error: {withheld} ids of the previous output ({share} of its 500 rows) are gone "
        f"from the input, over --max-deletes {limit}: nothing was deleted (new and changed "
        f"documents were written); run the same command with --max-deletes {withheld} (or "
        "all) to delete them"
    )


def test_a_few_deletes_over_the_limit_are_shown_as_a_share_that_is_not_none():
    from bulkembed.config import RunConfig
    from bulkembed.incremental.deletions import Deletions
    from bulkembed.spellings import delete_limit as _delete_limit

    # `-0` is 0, from the command line and from Python.
    limit = _delete_limit("-0")
    assert f"{limit:g}" == "0"
    config = RunConfig(inputs=("c",), output="o", model="m", max_deletes=-0.0)
    assert f"{config.run.max_deletes:g}" == "0"
    assert Deletions(0, 0, 1, "--max-deletes").message(300, limit) == (
        "1 id of the previous output (0.3% of its 300 rows) is gone from the input, over "
        "--max-deletes 0: nothing was deleted (new and changed documents were written); run "
        "the same command with --max-deletes 1 (or all) to delete them"
    )


def test_max_deletes_stops_a_mass_delete_of_a_table_until_allowed(previous, tmp_path):
    model, corpus, prev, db = _copies(previous, tmp_path, "jsonl")
    _edit(corpus, removed=(3, 4))
    uri = f"lancedb://{db}?table=docs"
    stopped = _sync(model, corpus, uri, uri)
    assert stopped.exit_code == DELETES
    assert stopped.stderr.strip() == _over_the_limit_message(200, "40%", "0.1")
    table, before = _table(db), _table(previous[1]["jsonl"][2])
    assert table.num_rows == 501
    edited = [t.filter(pc.equal(t["id"], "f0-0"))["content_hash"][0] for t in (table, before)]
    assert edited[0] != edited[1]
    summary = _summary(db / "_bulkembed" / "docs")
    counts = ("docs", "new", "changed", "deleted", "kept_unread", "deletes_withheld")
    assert {k: summary[k] for k in counts} == {
        "docs": 501,
        "new": 1,
        "changed": 1,
        "deleted": 0,
        "kept_unread": 0,
        "deletes_withheld": 200,
    }
    assert _sync(model, corpus, uri, uri).exit_code == DELETES  # the same limit: still held
    allowed = _sync(model, corpus, uri, uri, "--max-deletes", "200")
    assert allowed.exit_code == DONE, allowed.output
    table = _table(db)
    assert table.num_rows == 301
    assert not any(i.startswith(("f3-", "f4-")) for i in table["id"].to_pylist())
    summary = _summary(db / "_bulkembed" / "docs")
    assert (summary["docs"], summary["deleted"], summary["deletes_withheld"]) == (301, 200, 0)
    assert _sync(model, corpus, uri, uri).exit_code == DONE  # nothing to do


def test_max_deletes_stops_a_mass_delete_in_a_change_set_until_allowed(previous, tmp_path):
    model, corpus, prev, _ = _copies(previous, tmp_path, "jsonl")
    out = tmp_path / "out"
    _edit(corpus, removed=(3, 4))
    stopped = _sync(model, corpus, str(out), str(prev), "--max-deletes", "150")
    assert stopped.exit_code == DELETES
    assert stopped.stderr.strip() == _over_the_limit_message(200, "40%", "150")
    changes = out / "_bulkembed" / "changes"
    assert sorted(pq.read_table(changes / "upserts")["id"].to_pylist()) == ["f0-0", "f0-new"]
    assert _deletes(out) == []
    # The output holds what the store holds once this change set is applied.
    ids = pq.read_table(out)["id"].to_pylist()
    assert len(ids) == len(set(ids)) == 501
    shown = CliRunner().invoke(app, ["status", str(out), "--json"])
    status = json.loads(shown.stdout)
    assert (shown.exit_code, status["state"], status["docs"]) == (DELETES, "withheld", 501)
    assert status["message"] == (
        "finished without deleting: 200 ids gone from the input kept (over --max-deletes): "
        "check the input, or run the same command with a higher --max-deletes"
    )
    allowed = _sync(model, corpus, str(out), str(prev), "--max-deletes", "0.4")
    assert allowed.exit_code == DONE, allowed.output
    assert _deletes(out) == sorted(f"f{f}-{i}" for f in (3, 4) for i in range(PER_FILE))
    assert pq.read_table(out).num_rows == 301
    # The units of rows kept are gone with the deletes: one part per input file is left.
    parts = sorted(p.name for p in out.glob("part-*"))
    assert parts == [f"part-0000{f}-000000.parquet" for f in (0, 1, 2)]


def test_a_damaged_input_holds_back_every_delete_until_an_input_is_read_whole(previous, tmp_path):
    model, corpus, prev, _ = _copies(previous, tmp_path, "jsonl")
    out = tmp_path / "out"
    _damage(corpus, "jsonl", "cut")
    (corpus / "f4.jsonl").unlink()
    result = _sync(model, corpus, str(out), str(prev), "--max-deletes", "0.25")
    assert result.exit_code == DONE, result.output
    # The part of f2 not read may hold any id, f4's too: nothing is deleted.
    assert _deletes(out) == []
    assert pq.read_table(out).num_rows == FILES * PER_FILE
    summary = _summary(out / "_bulkembed")
    read = sum(1 for line in (corpus / "f2.jsonl").read_text().splitlines() if line.endswith("}"))
    assert (summary["deleted"], summary["kept_unread"]) == (0, 2 * PER_FILE - read)
    bad = _quarantine(out / "_bulkembed")
    assert [(b["source"], b["previous"]) for b in bad] == [
        (str(corpus / "f2.jsonl"), "its id is unknown: no row is deleted")
    ]
    # f2 whole again: the next run deletes f4's ids, from the rows the last one kept.
    _write(corpus, "jsonl", 2, _records(2))
    again = _sync(model, corpus, str(tmp_path / "out-2"), str(out), "--max-deletes", "0.25")
    assert again.exit_code == DONE, again.output
    assert _deletes(tmp_path / "out-2") == sorted(f"f4-{i}" for i in range(PER_FILE))
    ids = set(pq.read_table(tmp_path / "out-2")["id"].to_pylist())
    assert ids == {f"f{f}-{i}" for f in range(4) for i in range(PER_FILE)}


def test_a_table_sync_over_a_damaged_input_keeps_every_row_it_did_not_read(previous, tmp_path):
    model, corpus, prev, db = _copies(previous, tmp_path, "jsonl")
    records = _records(1)
    records[40]["text"] = None
    _write(corpus, "jsonl", 1, records)
    _damage(corpus, "jsonl", "malformed")
    (corpus / "f4.jsonl").unlink()
    uri = f"lancedb://{db}?table=docs"
    result = _sync(model, corpus, uri, uri, "--max-deletes", "all")
    assert result.exit_code == DONE, result.output
    assert _table(db).num_rows == 500
    summary = _summary(db / "_bulkembed" / "docs")
    # f4's ids too: the line of f2 not read may hold any of them.
    assert (summary["deleted"], summary["kept_unread"]) == (0, 102)
    bad = _quarantine(db / "_bulkembed" / "docs" / "sync" / "_bulkembed")
    assert [(b.get("id"), b["previous"]) for b in bad] == [
        ("f1-40", "this id's row is kept"),
        (None, "its id is unknown: no row is deleted"),
    ]


def test_a_record_with_a_null_text_keeps_its_previous_row_and_says_so(previous, tmp_path):
    model, corpus, prev, _ = _copies(previous, tmp_path, "parquet")
    out = tmp_path / "out"
    _damage(corpus, "parquet", "null-text")
    (corpus / "f4.parquet").unlink()
    result = _sync(model, corpus, str(out), str(prev), "--max-deletes", "100")
    assert result.exit_code == DONE, result.output
    assert len(_deletes(out)) == 100
    kept = _by_id(pq.read_table(out)).filter(pc.equal(pc.field("id"), "f2-40"))
    before = _by_id(pq.read_table(prev)).filter(pc.equal(pc.field("id"), "f2-40"))
    assert kept.column("dense").equals(before.column("dense"))
    bad = _quarantine(out / "_bulkembed")
    assert [(b["id"], b["reason"], b["previous"]) for b in bad] == [
        ("f2-40", "text is null", "this id's row is kept")
    ]


@pytest.mark.parametrize("target", ["parquet", "lancedb"])
def test_a_directory_that_cannot_be_listed_keeps_the_rows_of_its_files(
    previous, tmp_path, monkeypatch, target
):
    model, corpus, prev, db = _copies(previous, tmp_path, "jsonl")
    (corpus / "sub").mkdir()
    (corpus / "f2.jsonl").rename(corpus / "sub" / "f2.jsonl")
    uri = f"lancedb://{db}?table=docs"
    out = uri if target == "lancedb" else str(tmp_path / "out")
    since = uri if target == "lancedb" else str(prev)
    if target == "parquet":
        # The previous output read f2 from sub/ too.
        moved = tmp_path / "prev"
        assert run_cli(corpus, model, moved, *SETTINGS).exit_code == 0
        since = str(moved)
    import os

    scandir = os.scandir

    def refused(path):
        if str(path).endswith("sub"):
            raise PermissionError(13, "Permission denied")
        return scandir(path)

    monkeypatch.setattr("bulkembed.sources.files.os.scandir", refused)
    result = _sync(model, corpus, out, since)
    assert result.exit_code == DONE, result.output
    assert f"input directory {corpus / 'sub'} (Permission denied) cannot be read" in result.stderr
    if target == "lancedb":
        assert _table(db).num_rows == 500
    else:
        assert pq.read_table(out).num_rows == 500
        assert _deletes(Path(out)) == []


@pytest.mark.parametrize("target", ["parquet", "lancedb"])
def test_a_run_over_its_bad_record_limit_deletes_nothing_until_the_limit_allows(
    previous, tmp_path, target
):
    model, corpus, prev, db = _copies(previous, tmp_path, "jsonl")
    _damage(corpus, "jsonl", "null-text")
    (corpus / "f4.jsonl").unlink()
    uri = f"lancedb://{db}?table=docs"
    out, since = (uri, uri) if target == "lancedb" else (str(tmp_path / "out"), str(prev))
    limits = ("--max-deletes", "all", "--max-bad-records")
    over = _sync(model, corpus, out, since, *limits, "0")
    assert over.exit_code == BAD
    assert over.stderr.strip() == (
        "error: 1 bad record, over --max-bad-records 0; the run finished and committed the "
        "rest; nothing was deleted (100 ids gone from the input kept)"
    )

    def ids() -> set:
        return set((_table(db) if target == "lancedb" else pq.read_table(out))["id"].to_pylist())

    assert len(ids()) == FILES * PER_FILE
    if target == "parquet":
        assert _deletes(Path(out)) == []
    assert _sync(model, corpus, out, since, *limits, "0").exit_code == BAD  # still over
    allowed = _sync(model, corpus, out, since, *limits, "1")
    assert allowed.exit_code == DONE, allowed.output
    assert ids() == {f"f{f}-{i}" for f in range(4) for i in range(PER_FILE)}
    if target == "parquet":
        assert _deletes(Path(out)) == sorted(f"f4-{i}" for i in range(PER_FILE))


def test_a_table_reopened_for_its_deletes_and_stopped_before_deciding_goes_on_later(
    previous, tmp_path, monkeypatch
):
    from bulkembed.engine.modes import in_place

    model, corpus, _, db = _copies(previous, tmp_path, "jsonl")
    _edit(corpus, removed=(3, 4))
    uri = f"lancedb://{db}?table=docs"
    assert _sync(model, corpus, uri, uri).exit_code == DELETES
    with monkeypatch.context() as patched:

        def stopped(*arguments):
            raise OSError(5, "Input/output error")

        patched.setattr(in_place, "missing_ids", stopped)
        assert _sync(model, corpus, uri, uri, "--max-deletes", "all").exit_code == 1
    # The version the sync began from was compacted away: the end step reads the table.
    allowed = _sync(model, corpus, uri, uri, "--max-deletes", "all")
    assert allowed.exit_code == DONE, allowed.output
    assert _table(db).num_rows == 301


def test_a_finished_change_set_whose_previous_output_is_gone_stays_finished(previous, tmp_path):
    model, corpus, prev, _ = _copies(previous, tmp_path, "jsonl")
    _edit(corpus, removed=(3, 4))
    shutil.copytree(prev, tmp_path / "prev")
    out = str(tmp_path / "out")
    assert _sync(model, corpus, out, str(tmp_path / "prev")).exit_code == DELETES
    shutil.rmtree(tmp_path / "prev")
    refused = _sync(model, corpus, out, str(tmp_path / "prev"), "--max-deletes", "all")
    assert refused.exit_code == USAGE
    assert (tmp_path / "out" / "_bulkembed" / "complete").exists()
    # Without deletes to take up, the output needs no previous output: nothing to do.
    again = _sync(model, corpus, out, str(tmp_path / "prev"))
    assert again.exit_code == DELETES
    shown = CliRunner().invoke(app, ["status", out, "--json"])
    status = json.loads(shown.stdout)
    assert (shown.exit_code, status["state"], status["docs"]) == (DELETES, "withheld", 501)


def test_deletes_withheld_by_both_limits_exit_4_once_the_bad_records_are_allowed(
    previous, tmp_path
):
    model, corpus, prev, _ = _copies(previous, tmp_path, "jsonl")
    _edit(corpus, removed=(3, 4))
    records = _records(1)
    records[40]["text"] = None
    _write(corpus, "jsonl", 1, records)
    out = str(tmp_path / "out")
    assert _sync(model, corpus, out, str(prev), "--max-bad-records", "0").exit_code == BAD
    assert _sync(model, corpus, out, str(prev), "--max-bad-records", "1").exit_code == DELETES


def test_an_id_that_is_not_valid_unicode_is_a_record_whose_id_is_unknown(previous, tmp_path):
    model, corpus, prev, _ = _copies(previous, tmp_path, "jsonl")
    with open(corpus / "f1.jsonl", "a") as f:
        f.write('{"id": "odd-\\ud800", "text": "a text"}\\n')
    (corpus / "f4.jsonl").unlink()
    out = tmp_path / "out"
    result = _sync(model, corpus, str(out), str(prev), "--max-deletes", "all")
    assert result.exit_code == DONE, result.output
    assert _deletes(out) == [] and pq.read_table(out).num_rows == FILES * PER_FILE


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "1.5", "some"])
def test_max_deletes_takes_a_count_a_fraction_or_all(previous, tmp_path, value):
    model, corpus, prev, _ = _copies(previous, tmp_path, "jsonl")
    result = _sync(model, corpus, str(tmp_path / "out"), str(prev), "--max-deletes", value)
    assert result.exit_code == USAGE
    assert result.stderr == (
        f"error: --max-deletes {value}: give a count (500), a fraction of the previous "
        "output's rows below 1 (0.25), or all\n"
    )

"""Inputs as they come from other tools: ids in some records only, byte-order marks, deep
JSON, links between directories, bytes columns from Spark."""

import contextlib
import json
import os
import signal

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import read_output, write_jsonl
from typer.testing import CliRunner

from bulkembed.cli import app
from bulkembed.sources import RecordReader, list_inputs


def _read(paths, **options):
    chunks = list(RecordReader(list_inputs([str(p) for p in paths]), **options).read())
    ids = [i for c in chunks for i in c.ids.to_pylist()]
    texts = [t for c in chunks for t in c.texts.to_pylist()]
    bad = [b for c in chunks for b in c.bad]
    return ids, texts, bad


class _TooSlow(Exception):
    """Not an OSError (a TimeoutError is one): code that swallows those cannot stop it."""


@contextlib.contextmanager
def _within(seconds):
    """Fail instead of hanging when the body takes longer than `seconds`."""

    def late(signal_number, frame):
        raise _TooSlow(f"took more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, late)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_a_jsonl_record_without_an_id_is_set_aside_and_the_others_keep_theirs(tmp_path):
    path = write_jsonl(
        tmp_path / "c.jsonl",
        [{"text": "first, no id"}, {"id": "b", "text": "second"}, {"id": "c", "text": "third"}],
    )
    ids, texts, bad = _read([path])
    assert ids == ["b", "c"] and texts == ["second", "third"]
    assert [(b.line, b.reason) for b in bad] == [(1, "no 'id' field")]


def test_a_jsonl_file_whose_records_have_no_ids_takes_ids_from_its_name(tmp_path):
    with_ids = write_jsonl(tmp_path / "a.jsonl", [{"id": "x", "text": "one"}])
    without = write_jsonl(tmp_path / "b.jsonl", [{"text": "two"}, {"text": "three"}])
    ids, _, bad = _read([with_ids, without])
    assert ids == ["x", "b.jsonl:0", "b.jsonl:1"] and bad == []


def test_a_byte_order_mark_at_the_start_of_a_jsonl_file_is_not_a_bad_record(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"id": "a", "text": "one"}\n{"id": "b", "text": "two"}\n')
    ids, texts, bad = _read([path])
    assert ids == ["a", "b"] and texts == ["one", "two"] and bad == []


def test_a_deeply_nested_json_line_is_one_bad_record(tmp_path, tiny_st):
    path = tmp_path / "c.jsonl"
    deep = "[" * 100_000 + "]" * 100_000
    lines = [
        '{"id": "a", "text": "before"}',
        '{"id": "b", "text": "deep", "meta": ' + deep + "}",
        '{"id": "c", "text": "after"}',
    ]
    path.write_text("\n".join(lines) + "\n")
    ids, _, bad = _read([path])
    assert ids == ["a", "c"]
    assert [(b.line, b.reason) for b in bad] == [(2, "JSON nested too deeply to read")]
    out = tmp_path / "out"
    arguments = ["run", str(path), "--model", str(tiny_st("mean")), "--output", str(out)]
    result = CliRunner().invoke(app, [*arguments, "--quiet", "--tokenize-workers", "0"])
    assert result.exit_code == 0, result.output
    assert sorted(read_output(out)) == ["a", "c"]
    quarantined = (out / "_bulkembed" / "bad_records.jsonl").read_text().splitlines()
    assert [json.loads(q)["line"] for q in quarantined] == [2]


def test_malformed_json_messages_read_cleanly(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_bytes(b'{"id": "a", "text": "tab\there"}\n')
    _, _, bad = _read([path])
    assert [b.reason for b in bad] == ["malformed JSON: Invalid control character at column 25"]


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symbolic links")
def test_links_to_directories_are_followed_once_and_loops_end(tmp_path):
    corpus = tmp_path / "corpus"
    elsewhere = tmp_path / "elsewhere"
    write_jsonl(corpus / "a" / "one.jsonl", [{"id": "1", "text": "one"}])
    write_jsonl(elsewhere / "two.jsonl", [{"id": "2", "text": "two"}])
    (corpus / "linked").symlink_to(elsewhere, target_is_directory=True)
    (corpus / "a" / "loop").symlink_to(corpus, target_is_directory=True)
    (corpus / "a" / "self").symlink_to(corpus / "a", target_is_directory=True)
    with _within(20):
        by_directory = list_inputs([str(corpus)])
        by_glob = list_inputs([str(corpus / "**" / "*.jsonl")])
    assert [s.name for s in by_directory] == ["a/one.jsonl", "linked/two.jsonl"]
    assert [s.name for s in by_glob] == ["a/one.jsonl", "linked/two.jsonl"]


def test_globs_match_as_the_shell_does(tmp_path):
    for name in ("x/one.jsonl", "x/y/two.jsonl", "x/.hidden/three.jsonl", "x/y/z/four.jsonl"):
        write_jsonl(tmp_path / name, [{"id": name, "text": "t"}])

    def names(pattern):
        return [s.name for s in list_inputs([f"{tmp_path}/{pattern}"])]

    assert names("x/*.jsonl") == ["one.jsonl"]
    assert names("x/*/*.jsonl") == ["y/two.jsonl"]
    assert names("x/**/*.jsonl") == ["one.jsonl", "y/two.jsonl", "y/z/four.jsonl"]
    assert names("x/.hidden/*.jsonl") == ["three.jsonl"]
    assert names("x/y") == ["two.jsonl", "z/four.jsonl"]
    assert names("x/[y]") == ["y/two.jsonl", "y/z/four.jsonl"]
    assert names("x/**") == [".hidden/three.jsonl", "one.jsonl", "y/two.jsonl", "y/z/four.jsonl"]
    assert names("x/*/") == ["y/two.jsonl", "y/z/four.jsonl"]


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symbolic links")
def test_a_file_reached_through_a_link_and_directly_is_named_by_its_direct_path(tmp_path):
    data = tmp_path / "data"
    write_jsonl(data / "v1" / "x.jsonl", [{"id": "1", "text": "one"}])
    write_jsonl(data / "v2" / "x.jsonl", [{"id": "2", "text": "two"}])
    (data / "current").symlink_to(data / "v2", target_is_directory=True)
    assert [s.name for s in list_inputs([str(data)])] == ["v1/x.jsonl", "v2/x.jsonl"]
    assert [s.name for s in list_inputs([str(data / "v*" / "*.jsonl")])] == [
        "v1/x.jsonl",
        "v2/x.jsonl",
    ]
    assert [s.name for s in list_inputs([str(data / "current")])] == ["x.jsonl"]


def test_an_unreadable_directory_is_left_out_with_a_warning(tmp_path, tiny_st, monkeypatch):
    corpus = tmp_path / "corpus"
    write_jsonl(corpus / "a.jsonl", [{"id": "a", "text": "one"}])
    write_jsonl(corpus / "locked" / "b.jsonl", [{"id": "b", "text": "two"}])
    scandir = os.scandir

    def refuse_locked(path):
        if os.fspath(path).endswith("locked"):
            raise PermissionError(13, "Permission denied")
        return scandir(path)

    monkeypatch.setattr(os, "scandir", refuse_locked)
    out = tmp_path / "out"
    arguments = ["run", str(corpus), "--model", str(tiny_st("mean")), "--output", str(out)]
    result = CliRunner().invoke(app, [*arguments, "--quiet", "--tokenize-workers", "0"])
    assert result.exit_code == 0, result.output
    assert result.stderr.strip() == (
        f"warning: input directory {corpus / 'locked'} (Permission denied) cannot be read: "
        "its files are left out"
    )
    assert sorted(read_output(out)) == ["a"]


def _binary_corpus(path):
    texts = [b"first text", "caf\u00e9 au lait".encode(), b"caf\xe9 latin-1", None]
    table = pa.table(
        {
            "id": pa.array([b"a", b"b", b"c", b"d"], pa.binary()),
            "text": pa.array(texts, pa.binary()),
        }
    )
    pq.write_table(table, path)
    return path


def test_binary_text_columns_are_read_as_utf8_and_invalid_values_set_aside(tmp_path, tiny_st):
    path = _binary_corpus(tmp_path / "spark.parquet")
    ids, texts, bad = _read([path])
    assert ids == ["a", "b"] and texts == ["first text", "caf\u00e9 au lait"]
    assert [(b.row, b.id, b.reason) for b in bad] == [
        (2, "c", "text is not valid UTF-8 (byte 3 of a binary column)"),
        (3, "d", "text is null"),
    ]
    out = tmp_path / "out"
    arguments = ["run", str(path), "--model", str(tiny_st("mean")), "--output", str(out)]
    result = CliRunner().invoke(app, [*arguments, "--quiet", "--tokenize-workers", "0"])
    assert result.exit_code == 0, result.output
    assert sorted(read_output(out)) == ["a", "b"]
    assert pq.read_schema(next(out.glob("part-*.parquet"))).field("id").type == pa.string()

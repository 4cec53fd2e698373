"""CSV and TSV inputs: read as the same records as JSON lines give, values as text, quoted
delimiters and newlines kept, a malformed file quarantined; and a format registered from another
file."""

import csv
import json
import re

import numpy as np
import pyarrow.parquet as pq
import pytest
from helpers import read_output, run_cli, sample_texts, write_jsonl

from bulkembed.cli.options import Inputs
from bulkembed.contracts import RUN_DIRECTORY
from bulkembed.errors import UsageError
from bulkembed.sources import list_inputs, readable, register_format, unregister_format
from bulkembed.sources.delimited import DelimitedFormat


def _write(path, rows, delimiter=","):
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, delimiter=delimiter)
        writer.writerow(["id", "text", "lang"])
        writer.writerows(rows)
    return path


def test_csv_and_tsv_give_the_vectors_json_lines_give(tmp_path, tiny_st):
    model = tiny_st("mean")
    texts = sample_texts(30)
    # A delimiter, a quote and newlines inside values.
    texts[3] = 'one, "two"\nthree\tfour'
    rows = [(f"d{i}", text, "en") for i, text in enumerate(texts)]
    jsonl = write_jsonl(tmp_path / "c.jsonl", [{"id": i, "text": t} for i, t, _ in rows])
    outputs = {}
    for name, corpus in (
        ("jsonl", jsonl),
        ("csv", _write(tmp_path / "c.csv", rows)),
        ("tsv", _write(tmp_path / "c.tsv", rows, "\t")),
    ):
        extra = ("--id-column", "id", "--records-per-unit", "7")
        result = run_cli(corpus, model, tmp_path / name, *extra)
        assert result.exit_code == 0, result.output
        outputs[name] = read_output(tmp_path / name)
    assert sorted(outputs["csv"]) == sorted(f"d{i}" for i in range(30))
    for name in ("csv", "tsv"):
        assert outputs[name].keys() == outputs["jsonl"].keys()
        for key, vector in outputs[name].items():
            np.testing.assert_array_equal(vector, outputs["jsonl"][key])
    # 30 rows at 7 a unit: five parts.
    assert len(list((tmp_path / "csv").glob("part-*.parquet"))) == 5


def test_csv_values_are_text_and_malformed_rows_are_quarantined(tmp_path, tiny_st):
    rows = [("1", "first text", "en"), ("2", "", "en"), ("3", "third text", "7")]
    corpus = _write(tmp_path / "numbers.csv", rows)
    out = tmp_path / "out"
    model = tiny_st("mean")
    result = run_cli(corpus, model, out, "--id-column", "id", "--keep-columns", "lang")
    assert result.exit_code == 0, result.output
    table = pq.read_table(out).sort_by("id")
    # Ids and kept columns as the file spells them: no column turns into numbers.
    assert table.column("id").to_pylist() == ["1", "2", "3"]
    assert table.column("lang").to_pylist() == ["en", "en", "7"]
    # A row of another number of fields than the header is left out and quarantined; the
    # rows around it are embedded.
    broken = tmp_path / "broken.csv"
    broken.write_text("id,text\n1,fine\n2,one,two\n3,also fine\n")
    result = run_cli(broken, model, tmp_path / "broken", "--id-column", "id")
    assert result.exit_code == 0, result.output
    assert sorted(read_output(tmp_path / "broken")) == ["1", "3"]
    bad = (tmp_path / "broken" / RUN_DIRECTORY / "bad_records.jsonl").read_text()
    found = [json.loads(line) for line in bad.splitlines()]
    assert [(b["reason"], b["row"]) for b in found] == [
        ("a row of 3 fields where the header has 2: '2,one,two'", 0)
    ]
    # Bytes that are not UTF-8: the block cannot be read as text, and the rest of the file
    # is quarantined.
    undecodable = tmp_path / "undecodable.csv"
    undecodable.write_bytes(b"id,text\n1,fine\n2,\xff\xfe not text\n")
    result = run_cli(undecodable, model, tmp_path / "undecodable", "--id-column", "id")
    assert result.exit_code == 0, result.output
    bad = (tmp_path / "undecodable" / RUN_DIRECTORY / "bad_records.jsonl").read_text()
    reasons = [json.loads(line)["reason"] for line in bad.splitlines()]
    assert len(reasons) == 1 and reasons[0].startswith("unreadable from row 0 on: ")


def test_a_format_registered_from_another_file_is_found_by_its_suffix(tmp_path):
    class Semicolons(DelimitedFormat):
        name = "semicolons"
        suffixes = (".ssv",)
        in_folders = True

    (tmp_path / "a.ssv").write_text("id;text\n1;x\n")
    (tmp_path / "b.parquet").write_bytes(b"")
    assert [f.format for f in list_inputs([str(tmp_path)])] == ["parquet"]
    semicolons = Semicolons()
    register_format(semicolons)
    try:
        found = list_inputs([str(tmp_path)])
        assert [(f.name, f.format) for f in found] == [
            ("a.ssv", "semicolons"),
            ("b.parquet", "parquet"),
        ]
        assert readable().endswith(".csv, .tsv, .ssv")
    finally:
        unregister_format(semicolons)
    assert ".ssv" not in readable()


def test_csv_files_are_read_where_named_or_globbed_not_found_in_a_folder(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    _write(corpus / "labels.csv", [("1", "a label", "en")])
    with pytest.raises(UsageError) as refused:
        list_inputs([str(corpus)])
    assert str(refused.value) == (
        "no input file (.parquet, .jsonl, .jsonl.gz, .json (JSON lines), .arrow, "
        ".jpg, .jpeg, .png, .webp, .gif, .tif, .tiff, .bmp (images), .tar (WebDataset "
        "shards)) found in "
        f"{corpus}; .csv, .tsv files are read when named or matched by a glob"
    )
    (corpus / "docs.jsonl").write_text('{"text": "a"}\n')
    # A side file of a folder of inputs is not input: the folder reads as it always did.
    assert [f.name for f in list_inputs([str(corpus)])] == ["docs.jsonl"]
    assert [f.name for f in list_inputs([str(corpus / "*.csv")])] == ["labels.csv"]
    assert [f.name for f in list_inputs([str(corpus / "labels.csv")])] == ["labels.csv"]


def test_an_empty_csv_holds_no_record_and_a_doubled_column_is_one_line(tmp_path, tiny_st):
    model = tiny_st("mean")
    (tmp_path / "empty.csv").write_text("")
    result = run_cli(tmp_path / "empty.csv", model, tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "out" / RUN_DIRECTORY / "bad_records.jsonl").exists()
    doubled = tmp_path / "doubled.csv"
    doubled.write_text("text,text\na,b\n")
    result = run_cli(doubled, model, tmp_path / "doubled")
    assert result.output.strip() == (
        f"error: {doubled}: its header names the column 'text' twice: rename one"
    )


def test_the_inputs_help_names_every_registered_suffix():
    help_text = Inputs.__metadata__[0].help
    for suffix in re.sub(r" \([^)]*\)", "", readable()).split(", "):
        assert suffix in help_text, suffix

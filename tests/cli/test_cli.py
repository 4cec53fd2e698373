import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import read_output, run_cli, sample_texts, write_jsonl, write_parquet
from typer.testing import CliRunner

from bulkembed.cli import app

runner = CliRunner()


def _corpus(tmp_path, n=120):
    texts = sample_texts(n)
    records = [{"id": f"doc-{i}", "text": t} for i, t in enumerate(texts)]
    write_jsonl(tmp_path / "corpus" / "a.jsonl", records[: n // 2])
    write_parquet(tmp_path / "corpus" / "b.parquet", records[n // 2 :], row_group_size=25)
    return tmp_path / "corpus", records


def test_run_writes_every_id_once_with_vectors_matching_direct_encoding(tmp_path, tiny_st):
    from sentence_transformers import SentenceTransformer

    corpus, records = _corpus(tmp_path)
    out = tmp_path / "out"
    result = run_cli(corpus, tiny_st("mean"), out, "--max-batch-tokens", "512")
    assert result.exit_code == 0, result.output
    vectors = read_output(out)
    assert sorted(vectors) == sorted(r["id"] for r in records)
    reference = SentenceTransformer(str(tiny_st("mean")), device="cpu").encode(
        [r["text"] for r in records]
    )
    ours = np.array([vectors[r["id"]] for r in records])
    assert (ours * reference).sum(axis=1).min() >= 0.9999

    schema = pq.read_schema(next(out.glob("*.parquet")))
    dense = schema.field("dense").type
    assert pa.types.is_fixed_size_list(dense) and dense.list_size == 32
    assert dense.value_type == pa.float32()
    assert schema.field("id").type == pa.string()
    summary = json.loads((out / "_bulkembed" / "summary.json").read_text())
    assert summary["docs"] == 120 and summary["bad_records"] == 0
    assert 0 < summary["padding_efficiency"] <= 1
    # JSONL: 1 unit (4096 lines each); Parquet: 60 rows in row groups of 25 = 3 units.
    assert sorted(p.name for p in out.glob("*.parquet")) == [
        "part-00000-000000.parquet",
        "part-00001-000000.parquet",
        "part-00001-000001.parquet",
        "part-00001-000002.parquet",
    ]


def test_rerun_with_overwrite_gives_the_same_ids_and_vectors(tmp_path, tiny_st):
    corpus, _ = _corpus(tmp_path, 60)
    out = tmp_path / "out"
    assert run_cli(corpus, tiny_st("cls"), out).exit_code == 0
    first = read_output(out)
    result = run_cli(corpus, tiny_st("cls"), out, "--overwrite")
    assert result.exit_code == 0, result.output
    second = read_output(out)
    assert first.keys() == second.keys()
    for key in first:
        np.testing.assert_allclose(first[key], second[key], rtol=1e-6, atol=1e-7)


def test_worker_processes_give_the_same_output_as_in_process(tmp_path, tiny_st):
    corpus, _ = _corpus(tmp_path, 80)
    model = tiny_st("mean")
    assert run_cli(corpus, model, tmp_path / "a").exit_code == 0
    result = runner.invoke(
        app,
        [
            "run",
            str(corpus),
            "--model",
            str(model),
            "--output",
            str(tmp_path / "b"),
            "--quiet",
            "--tokenize-workers",
            "2",
        ],
    )
    assert result.exit_code == 0, result.output
    a, b = read_output(tmp_path / "a"), read_output(tmp_path / "b")
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_allclose(a[key], b[key], rtol=1e-5, atol=1e-6)


def test_bad_records_are_quarantined_and_counted(tmp_path, tiny_st):
    path = tmp_path / "c.jsonl"
    path.write_text('{"id": "a", "text": "fine"}\n{"id": "b", "text": null}\n{broken\n')
    out = tmp_path / "out"
    result = run_cli(path, tiny_st("mean"), out)
    assert result.exit_code == 0, result.output
    assert list(read_output(out)) == ["a"]
    bad = [
        json.loads(line)
        for line in (out / "_bulkembed" / "bad_records.jsonl").read_text().splitlines()
    ]
    assert [(b["line"], b.get("id"), b["reason"].split(":")[0]) for b in bad] == [
        (2, "b", "text is null"),
        (3, None, "malformed JSON"),
    ]
    assert json.loads((out / "_bulkembed" / "summary.json").read_text())["bad_records"] == 2


def test_limit_and_integer_ids(tmp_path, tiny_st):
    path = write_parquet(
        tmp_path / "c.parquet", [{"id": i, "text": t} for i, t in enumerate(sample_texts(30))]
    )
    out = tmp_path / "out"
    assert run_cli(path, tiny_st("mean"), out, "--limit", "7").exit_code == 0
    table = pq.read_table(out)
    assert table.column("id").to_pylist() == list(range(7))
    assert table.schema.field("id").type == pa.int64()


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (
            ["{tmp}/missing.jsonl", "--model", "{model}"],
            2,
            "error: input not found: {tmp}/missing.jsonl",
        ),
        (
            ["{corpus}", "--model", "no-such/model"],
            1,
            "error: model 'no-such/model' is not in the Hugging Face cache, and the Hub "
            "cannot be reached (offline)",
        ),
        (
            ["{corpus}", "--model", "{model}", "--text-column", "body"],
            1,
            "error: text column 'body' not found in",
        ),
        (
            ["{corpus}", "--model", "{model}", "--output", "{tmp}/file.txt/out"],
            1,
            "error: cannot write to {tmp}/file.txt/out",
        ),
        (
            ["{corpus}", "--model", "{model}", "--output", "{corpus}"],
            2,
            "error: --output {corpus} is one of the inputs ({corpus}): choose another --output",
        ),
    ],
    ids=[
        "missing-input",
        "unknown-model",
        "missing-text-column",
        "unwritable-output",
        "output-is-an-input",
    ],
)
def test_user_errors_are_one_line_without_traceback(tmp_path, tiny_st, args, code, message):
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"id": "a", "text": "hello", "title": "t"}])
    (tmp_path / "file.txt").write_text("a file, not a directory")
    values = {"tmp": tmp_path, "model": tiny_st("mean"), "corpus": corpus}
    argv = [a.format(**values) for a in args]
    if "--output" not in argv:
        argv += ["--output", str(tmp_path / "out")]
    result = CliRunner().invoke(app, ["run", *argv, "--quiet", "--tokenize-workers", "0"])
    assert result.exit_code == code
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(message.format(**values))
    assert "Traceback" not in result.output


def test_missing_text_column_lists_the_columns(tmp_path, tiny_st):
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"id": "a", "body": "hello", "title": "t"}])
    result = run_cli(corpus, tiny_st("mean"), tmp_path / "out")
    assert result.exit_code == 1
    assert "columns: id, body, title" in result.stderr


def test_conflicting_prompt_options_are_refused(tmp_path, tiny_st):
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": "x"}])
    result = run_cli(corpus, tiny_st("mean"), tmp_path / "o", "--prompt", "a", "--prompt-name", "b")
    assert result.exit_code == 2
    assert result.stderr.strip() == "error: --prompt and --prompt-name conflict: pass one of them"


def test_help_does_not_import_torch():
    code = (
        "import sys\n"
        "from bulkembed.cli import main\n"
        "sys.argv = ['bulkembed', 'run', '--help']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print('HEAVY:', sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    env = {**os.environ, "COLUMNS": "200"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert "--max-batch-tokens" in result.stdout
    assert "HEAVY: []" in result.stdout


def test_recipes_list_and_show():
    listed = runner.invoke(app, ["recipes"])
    assert listed.exit_code == 0
    names = [line.split()[0] for line in listed.stdout.splitlines()[:-1]]
    assert names == sorted(names) and {"all-minilm-l6-v2", "bge-m3", "e5-base-v2"} <= set(names)
    shown = runner.invoke(app, ["recipes", "show", "e5-base-v2"])
    assert 'document: "passage: "' in shown.stdout
    missing = runner.invoke(app, ["recipes", "show", "nope"])
    assert missing.exit_code == 2 and "unknown recipe 'nope'" in missing.stderr


def test_the_summary_table_shows_stage_seconds_on_one_line():
    from rich.console import Console

    from bulkembed.reporting.printing import summary_table

    console = Console(width=120, record=True)
    console.print(summary_table({"stage_seconds": {"read": 0.5, "write": 1.25}, "docs": 1000}))
    text = console.export_text()
    assert "stage seconds │ read 0.5, write 1.25" in text
    assert "docs          │                1,000" in text

"""`--output -`: every record on stdout, logs on stderr, a closed pipe ends the run cleanly."""

import json
import os
import re
import shlex
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import sample_texts, write_jsonl, write_parquet
from typer.testing import CliRunner

from bulkembed.cli import app
from bulkembed.config import StreamFormat
from bulkembed.contracts import Embeddings, SparseRows, SparseVector
from bulkembed.schema import output_schema, record_batch
from bulkembed.sinks.stream import StreamSink, json_lines

READ_EVERY_LINE = (
    "import json, sys; rows = [json.loads(line) for line in sys.stdin]; "
    "print(json.dumps({'ids': [r['id'] for r in rows], 'dense': [r['dense'] for r in rows]}))"
)


def _corpus(tmp_path, n=600):
    records = [{"id": f"doc-{i}", "text": t} for i, t in enumerate(sample_texts(n))]
    records[7]["text"] = None
    write_parquet(tmp_path / "corpus" / "a.parquet", records[: n // 2], row_group_size=50)
    write_jsonl(tmp_path / "corpus" / "b.jsonl", records[n // 2 :])
    return tmp_path / "corpus", records


def _command(corpus, model, *extra):
    return [
        sys.executable, "-m", "bulkembed", "run", str(corpus), "--model", str(model),
        "--output", "-", "--tokenize-workers", "1", *extra,
    ]  # fmt: skip


def _reference(tmp_path, corpus, model):
    out = tmp_path / "reference"
    arguments = ["run", str(corpus), "--model", str(model), "--output", str(out), "-q"]
    result = CliRunner().invoke(app, [*arguments, "--tokenize-workers", "0"])
    assert result.exit_code == 0, result.output
    return pq.read_table(out)


@pytest.mark.slow
def test_a_loader_reads_every_record_from_the_pipe(tmp_path, tiny_st):
    corpus, records = _corpus(tmp_path)
    model = tiny_st("mean")
    bulkembed = shlex.join(_command(corpus, model, "--stream-format", "jsonl"))
    loader = shlex.join([sys.executable, "-c", READ_EVERY_LINE])
    result = subprocess.run(
        ["bash", "-o", "pipefail", "-c", f"{bulkembed} | {loader}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    read = json.loads(result.stdout)
    expected = [r["id"] for r in records if r["text"] is not None]
    assert read["ids"] == expected  # input order, the bad record left out
    assert "bad record: " in result.stderr and '"reason": "text is null"' in result.stderr
    reference = _reference(tmp_path, corpus, model)
    assert reference.column("id").to_pylist() == expected
    # The shortest text of each float32 reads back as exactly that float32: the Arrow
    # stream of the same run (the same batches) holds the same floats.
    command = _command(corpus, model, "--stream-format", "arrow", "--quiet")
    arrow = subprocess.run(command, capture_output=True, timeout=300)
    exact = pa.ipc.open_stream(arrow.stdout).read_all().column("dense").to_pylist()
    streamed = np.array(read["dense"], dtype=np.float32)
    assert np.array_equal(streamed, np.array(exact, np.float32))
    np.testing.assert_allclose(streamed, np.array(reference.column("dense").to_pylist()), atol=1e-5)


@pytest.mark.slow
def test_head_closing_the_pipe_ends_the_run_without_a_traceback(tmp_path, tiny_st):
    corpus, _ = _corpus(tmp_path, n=2000)
    bulkembed = shlex.join(_command(corpus, tiny_st("mean")))
    script = f'{bulkembed} | head -1; echo "exit ${{PIPESTATUS[0]}}" >&2'
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=300)
    lines = result.stdout.splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["id"] == "doc-0"
    assert "exit 141" in result.stderr
    # The reader took one line at least: that record was written whole.
    written = re.search(r"stopped after (\d+) whole records? written\n", result.stderr)
    assert written is not None and int(written.group(1)) >= 1, result.stderr
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr


@pytest.mark.slow
def test_arrow_stream_holds_the_same_table(tmp_path, tiny_st):
    corpus, _ = _corpus(tmp_path, n=200)
    model = tiny_st("mean")
    command = _command(corpus, model, "--stream-format", "arrow", "--quiet")
    result = subprocess.run(command, capture_output=True, timeout=300)
    assert result.returncode == 0, result.stderr.decode()
    streamed = pa.ipc.open_stream(result.stdout).read_all()
    reference = _reference(tmp_path, corpus, model)
    assert streamed.column_names == reference.column_names
    assert streamed.column("id").equals(reference.column("id"))
    assert streamed.column("content_hash").equals(reference.column("content_hash"))
    # Each unit is embedded as a window of its own on a stream: other batches, the same
    # vectors to float32 rounding.
    np.testing.assert_allclose(
        np.array(streamed.column("dense").to_pylist()),
        np.array(reference.column("dense").to_pylist()),
        atol=1e-5,
    )


def test_stream_sink_turns_a_closed_pipe_into_one_error(tmp_path):
    read, write = os.pipe()
    os.close(read)
    stream = os.fdopen(write, "wb")
    sink = StreamSink(stream, StreamFormat.JSONL)
    schema = pa.schema([pa.field("id", pa.string())])
    sink.start(schema)
    with pytest.raises(Exception, match="stdout was closed by its reader; stopped after 0"):
        sink.write("part", pa.RecordBatch.from_pydict({"id": ["a"] * 100_000}, schema))
    stream.close()  # the descriptor now points at /dev/null: closing does not fail again


def test_a_pipe_closed_halfway_through_a_batch_counts_the_lines_it_took(monkeypatch):
    read, write = os.pipe()
    stream = os.fdopen(write, "wb")
    sink = StreamSink(stream, StreamFormat.JSONL)
    schema = pa.schema([pa.field("id", pa.string())])
    sink.start(schema)
    line = len(b'{"id":"a"}\n')
    taken = []

    def two_and_a_half_lines(descriptor, data):
        if taken:
            raise BrokenPipeError(32, "Broken pipe")
        taken.append(bytes(data[: 2 * line + 4]))
        return len(taken[0])

    monkeypatch.setattr("bulkembed.sinks.stream.os.write", two_and_a_half_lines)
    with pytest.raises(Exception, match="stopped after 2 whole records written$"):
        sink.write("part", pa.RecordBatch.from_pydict({"id": ["a"] * 10}, schema))
    monkeypatch.undo()
    stream.close()
    os.close(read)


def test_stream_options_are_checked(tmp_path, tiny_st):
    corpus, _ = _corpus(tmp_path, n=20)
    arguments = ["run", str(corpus), "--model", str(tiny_st("mean"))]
    output = ["-o", str(tmp_path / "o")]
    result = CliRunner().invoke(app, [*arguments, *output, "--stream-format", "arrow"])
    assert result.exit_code == 2 and "--stream-format applies to --output - only" in result.output
    result = CliRunner().invoke(app, [*arguments, "-o", "-", "--stream-format", "csv"])
    assert result.exit_code == 2
    assert "Invalid value for '--stream-format'" in result.output and "'csv'" in result.output


def test_json_lines_write_each_float32_in_its_shortest_text():
    vectors = np.array([[0.1, 1 / 3], [-2.5e-8, 7.0]], dtype=np.float32)
    sparse = SparseRows.of(
        [
            SparseVector(np.array([3, 9]), np.array([0.5, 1 / 7], np.float32)),
            SparseVector(np.array([], np.int64), np.array([], np.float32)),
        ]
    )
    multivector = [np.array([[1 / 3, 0.2]], np.float32), np.empty((0, 2), np.float32)]
    schema = output_schema(
        pa.string(), pa.list_(pa.float32(), 2), True, pa.list_(pa.list_(pa.float32(), 2))
    )
    embeddings = Embeddings(vectors, sparse, multivector)
    digests = np.array([bytes(range(16)), bytes(range(16, 32))], dtype="S16")
    batch = record_batch(pa.array(["a", "b"]), embeddings, schema, digests, {})
    lines = json_lines(batch).decode().splitlines()
    assert lines[0] == (
        '{"id":"a","dense":[0.1,0.33333334],"sparse":{"indices":[3,9],"values":[0.5,0.14285715]},'
        '"multivector":[[0.33333334,0.2]],"content_hash":"000102030405060708090a0b0c0d0e0f"}'
    )
    # A slice (a batch split for a reader) starts at its own first row.
    assert json_lines(batch.slice(1)).decode().splitlines() == [lines[1]]
    row = json.loads(lines[1])
    assert row["sparse"] == {"indices": [], "values": []} and row["multivector"] == []
    assert np.float32(row["dense"][0]) == vectors[1, 0] and row["dense"][0] == -2.5e-8


@pytest.mark.slow
def test_each_unit_goes_out_as_soon_as_it_is_embedded(tmp_path, tiny_st):
    """300 documents in units of 50 fit one window of a file output; on a stream, each
    unit's rows are written once it is embedded, not with the last."""
    records = [{"id": f"doc-{i}", "text": t} for i, t in enumerate(sample_texts(300))]
    corpus = write_jsonl(tmp_path / "c.jsonl", records)
    command = _command(corpus, tiny_st("mean"), "--stream-format", "arrow", "--quiet")
    result = subprocess.run(
        [*command, "--records-per-unit", "50"], capture_output=True, timeout=300
    )
    assert result.returncode == 0, result.stderr.decode()
    reader = pa.ipc.open_stream(result.stdout)
    batches = [batch.column("id").to_pylist() for batch in reader]
    # One message a unit at most, and no message across two units.
    units = [{int(i.split("-")[1]) // 50 for i in ids} for ids in batches]
    assert len(batches) >= 6 and all(len(unit) == 1 for unit in units)
    assert [i for ids in batches for i in ids] == [r["id"] for r in records]

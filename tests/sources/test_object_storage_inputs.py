"""Inputs on object storage, against a real S3 server: found, read and resumed as the same
files on a local disk are, read with ranged requests, and errors in one line."""

import gzip
import io
import json
import os
import pickle
import random
import string
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import (
    ROOT,
    cosines,
    read_output,
    records,
    run_arguments,
    run_cli,
    status_of,
    write_jsonl,
    write_parquet,
)

from bulkembed import storage
from bulkembed.errors import InputError, UsageError
from bulkembed.sources import RecordReader, count_records, list_inputs, unit_names
from bulkembed.sources.opening import content_digest
from bulkembed.storage import ObjectPath


def _texts(n, start=0):
    """Records without an id column: ids come from the file's name and position."""
    return [{"text": r["text"]} for r in records(start + n)[start:]]


def _corpus(folder):
    """Parquet (row groups of 10), JSONL, JSONL.gz and Arrow files, a hidden file, a file
    that is no input, and a run directory, below `folder/corpus`."""
    corpus = folder / "corpus"
    write_parquet(corpus / "a.parquet", _texts(35), row_group_size=10)
    write_jsonl(corpus / "sub" / "b.jsonl", _texts(20, 35))
    write_parquet(corpus / "sub" / "deep" / "d.parquet", _texts(5, 55), row_group_size=2)
    with gzip.open(corpus / "sub" / "c.jsonl.gz", "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in _texts(15, 60))
    write_jsonl(corpus / ".hidden.jsonl", _texts(2, 75))
    table = pa.Table.from_pylist(_texts(6, 77))
    with pa.ipc.new_file(corpus / "sub" / "e.arrow", table.schema) as arrow:
        for batch in table.to_batches(max_chunksize=4):
            arrow.write_batch(batch)
    (corpus / "notes.txt").write_text("not an input")
    write_jsonl(corpus / "_bulkembed" / "summary.json", [{"docs": 1}])
    return corpus


def _upload(s3, corpus, prefix="corpus"):
    for path in sorted(p for p in corpus.rglob("*") if p.is_file()):
        s3.upload(path, f"{prefix}/{path.relative_to(corpus).as_posix()}")


def _read_unit(reader, index, unit, offset):
    chunks = list(reader.read_unit(index, unit, offset))
    return [(c.unit, c.ids.to_pylist(), c.texts.to_pylist(), c.last_in_unit) for c in chunks]


def test_a_prefix_lists_the_files_that_the_same_local_folder_does(s3, tmp_path):
    corpus = _corpus(tmp_path)
    _upload(s3, corpus)
    local = list_inputs([str(corpus)])
    remote = list_inputs([s3.uri("corpus") + "/"])
    assert [f.name for f in remote] == [f.name for f in local]
    assert [f.name for f in remote][:2] == [".hidden.jsonl", "a.parquet"]
    assert [(f.format, f.size) for f in remote] == [(f.format, f.size) for f in local]
    assert all(isinstance(f.path, ObjectPath) and f.modified > 0 for f in remote)
    assert [str(f.path) for f in remote] == [s3.uri(f"corpus/{f.name}") for f in local]
    one = list_inputs([s3.uri("corpus/sub/c.jsonl.gz")])
    assert [(f.name, f.format) for f in one] == [("c.jsonl.gz", "jsonl")]
    assert count_records(remote) == count_records(local) == 83


@pytest.mark.parametrize(
    "pattern",
    ["*.parquet", "**/*.jsonl.gz", "**/*.parquet", "sub/*", "*/", "**", "sub/**/*.parquet", "*"],
)
def test_globs_on_s3_select_the_files_that_local_globs_do(s3, tmp_path, pattern):
    corpus = _corpus(tmp_path)
    _upload(s3, corpus)
    local = [f.name for f in list_inputs([f"{corpus}/{pattern}"])]
    remote = [f.name for f in list_inputs([f"{s3.uri('corpus')}/{pattern}"])]
    assert remote == local
    assert remote


def test_only_the_matching_files_of_a_glob_are_read(s3, tmp_path):
    _upload(s3, _corpus(tmp_path))
    files = list_inputs([s3.uri("corpus/**/*.jsonl.gz")])
    assert [f.name for f in files] == ["sub/c.jsonl.gz"]
    with pytest.raises(UsageError, match=r"input pattern .*\*\.txt matches no"):
        list_inputs([s3.uri("corpus/**/*.txt")])


def test_the_output_prefix_and_run_directories_are_left_out(s3, tmp_path):
    corpus = _corpus(tmp_path)
    _upload(s3, corpus)
    write_parquet(tmp_path / "part.parquet", _texts(3))
    s3.upload(tmp_path / "part.parquet", "corpus/out/part-00000-00000.parquet")
    output = storage.location(s3.uri("corpus/out"))
    names = [f.name for f in list_inputs([s3.uri("corpus")], exclude=output)]
    assert names == [f.name for f in list_inputs([str(corpus)])]
    assert not any("out/" in n or "_bulkembed" in n for n in names)


def test_a_local_path_can_be_written_as_a_file_uri(tmp_path):
    corpus = _corpus(tmp_path)
    by_uri = [(f.path, f.name) for f in list_inputs([f"file://{corpus}"])]
    assert by_uri == [(f.path, f.name) for f in list_inputs([str(corpus)])]


@pytest.mark.parametrize("output", ["local", "s3"])
def test_a_corpus_on_s3_embeds_to_the_same_output_as_on_a_local_disk(s3, tmp_path, tiny_st, output):
    corpus = _corpus(tmp_path)
    _upload(s3, corpus, "data/corpus")
    model = tiny_st("mean")
    local = tmp_path / "local"
    assert run_cli(corpus, model, local, "--dtype", "float32").exit_code == 0
    remote = tmp_path / "remote" if output == "local" else storage.location(s3.uri("out"))
    result = run_cli(s3.uri("data/corpus") + "/", model, remote, "--dtype", "float32")
    assert result.exit_code == 0, result.output
    expected = pq.read_table(local).sort_by("id")
    if isinstance(remote, ObjectPath):
        got = pq.read_table(remote.key, filesystem=remote.fs).sort_by("id")
    else:
        got = pq.read_table(remote).sort_by("id")
    assert got.num_rows == 83 and got.equals(expected)
    ends = {"a.parquet:34", "sub/b.jsonl:19", "sub/c.jsonl.gz:14", "sub/e.arrow:5"}
    assert ends <= set(got["id"].to_pylist())
    config = json.loads((remote / "_bulkembed" / "config.json").read_text())
    assert config["input_paths"][1]["path"] == s3.uri("data/corpus/a.parquet")
    assert s3.server.secret_key not in json.dumps(config)


@pytest.mark.slow
def test_the_ray_engine_reads_s3_inputs_and_writes_an_s3_output(s3, tmp_path, tiny_st):
    pytest.importorskip("ray.data")
    corpus = _corpus(tmp_path)
    _upload(s3, corpus)
    model = tiny_st("mean")
    local = tmp_path / "local"
    assert run_cli(corpus, model, local, "--dtype", "float32").exit_code == 0
    remote = s3.uri("ray-out")
    arguments = run_arguments(s3.uri("corpus"), model, remote, "--engine", "ray", "-q")
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    environment.pop("RAY_ADDRESS", None)
    run = subprocess.run(
        [sys.executable, "-m", "bulkembed", *arguments],
        env=environment,
        capture_output=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr.decode()
    # Batches differ from the local engine's: vectors agree to float rounding.
    expected = read_output(local)
    output = storage.location(remote)
    table = pq.read_table(output.key, filesystem=output.fs)
    got = dict(zip(table.column("id").to_pylist(), table.column("dense").to_pylist(), strict=True))
    ids = sorted(expected)
    assert table.num_rows == len(got) and sorted(got) == ids and len(ids) == 83
    assert cosines([got[i] for i in ids], [expected[i] for i in ids]).min() >= 0.9999
    parts = sorted(p.name for p in local.glob("*.parquet"))
    assert [k for k in s3.keys("ray-out/") if k.endswith(".parquet")] == [
        f"ray-out/{p}" for p in parts
    ]
    assert "ray-out/_bulkembed/complete" in s3.keys("ray-out/_bulkembed/")


class _CountingFile(io.RawIOBase):
    """A remote random-access file that counts the bytes read through it."""

    read_bytes = 0

    def __init__(self, inner):
        self.inner = inner

    def readable(self):
        return True

    def seekable(self):
        return True

    def seek(self, offset, whence=0):
        return self.inner.seek(offset, whence)

    def tell(self):
        return self.inner.tell()

    def read(self, size=-1):
        data = self.inner.read(size)
        _CountingFile.read_bytes += len(data)
        return data

    def readinto(self, buffer):
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self):
        self.inner.close()
        super().close()


def _random_texts(n, seed=0):
    pick = random.Random(seed)
    letters = string.ascii_lowercase + " "
    return [{"text": "".join(pick.choice(letters) for _ in range(400))} for _ in range(n)]


def test_parquet_is_read_a_row_group_at_a_time_with_ranged_reads(s3, tmp_path, monkeypatch):
    path = write_parquet(tmp_path / "big.parquet", _random_texts(4000), row_group_size=200)
    s3.upload(path, "big/big.parquet")
    size = path.stat().st_size
    assert size > 1_000_000
    open_input = ObjectPath.open_input
    monkeypatch.setattr(ObjectPath, "open_input", lambda self: _CountingFile(open_input(self)))
    monkeypatch.setattr(ObjectPath, "read_bytes", lambda self: pytest.fail("a whole download"))
    monkeypatch.setattr(ObjectPath, "open_stream", lambda self: pytest.fail("a whole download"))
    files = list_inputs([s3.uri("big/big.parquet")])
    _CountingFile.read_bytes = 0
    assert count_records(files) == 4000 and len(unit_names(files, 1000)) == 20
    assert _CountingFile.read_bytes < size / 10
    reader = RecordReader(files, chunk_size=64)
    reader.check()
    _CountingFile.read_bytes = 0
    chunks = list(reader.read_unit(0, 13, None))
    assert [i for c in chunks for i in c.ids.to_pylist()] == [
        f"big.parquet:{n}" for n in range(2600, 2800)
    ]
    assert _CountingFile.read_bytes < size / 5


def test_a_remote_jsonl_unit_is_read_from_its_offset(s3, tmp_path, monkeypatch):
    corpus = tmp_path / "corpus"
    write_jsonl(corpus / "b.jsonl", _texts(25))
    with gzip.open(corpus / "c.jsonl.gz", "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in _texts(25, 25))
    _upload(s3, corpus)
    local, remote = (
        RecordReader(list_inputs([where]), chunk_size=3, records_per_unit=10)
        for where in (str(corpus), s3.uri("corpus"))
    )
    local.check()
    # As the Ray engine hands the reader to its tasks: the objects travel with their options.
    remote = pickle.loads(pickle.dumps(remote))
    remote.check()
    offsets = remote.unit_offsets(0)
    assert offsets == local.unit_offsets(0)
    assert offsets is not None and offsets[1] > 0
    assert remote.unit_offsets(1) is None
    # Reading from an offset takes ranged reads from there, not a stream from the start.
    with monkeypatch.context() as patched:
        patched.setattr(ObjectPath, "open_stream", lambda self: pytest.fail("read from start"))
        for unit in range(3):
            expected = _read_unit(local, 0, unit, offsets[unit])
            assert _read_unit(remote, 0, unit, offsets[unit]) == expected
            assert expected[-1][1][-1] == f"b.jsonl:{min(unit * 10 + 9, 24)}"
    for unit in range(3):
        expected = _read_unit(local, 1, unit, None)
        assert _read_unit(remote, 1, unit, None) == expected
        assert expected[0][1][0] == f"c.jsonl.gz:{unit * 10}"


def test_content_digests_of_objects_are_those_of_the_stored_bytes(s3, tmp_path):
    corpus = _corpus(tmp_path)
    _upload(s3, corpus)
    local = list_inputs([str(corpus)])
    remote = list_inputs([s3.uri("corpus")])
    assert [content_digest(f.path) for f in remote] == [content_digest(f.path) for f in local]


def test_verify_inputs_and_status_work_with_s3_inputs(s3, tmp_path, tiny_st):
    _upload(s3, _corpus(tmp_path))
    out = tmp_path / "out"
    model = tiny_st("mean")
    first = run_cli(s3.uri("corpus"), model, out, "--verify-inputs")
    assert first.exit_code == 0, first.output
    config = json.loads((out / "_bulkembed" / "config.json").read_text())
    inputs = config["fingerprint"]["inputs"]
    local = {f.name: content_digest(f.path) for f in list_inputs([str(tmp_path / "corpus")])}
    assert {i["name"]: i["content"] for i in inputs} == local
    again = run_cli(s3.uri("corpus"), model, out, "--verify-inputs")
    assert again.exit_code == 0, again.output
    marker = sorted((out / "_bulkembed" / "done").iterdir())[0]
    marker.unlink()
    figures = status_of(out)
    assert figures["inputs"] == 6 and figures["units_pending"] == 1


@pytest.fixture
def wrong_secret(s3, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    storage.filesystem.cache_clear()


@pytest.fixture
def unreachable_endpoint(s3, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    storage.filesystem.cache_clear()


@pytest.mark.parametrize(
    ("setting", "key", "said"),
    [
        (None, "s3://no-such-bucket-here/corpus/", "does not exist"),
        (None, "corpus/nothing-here.parquet", "input not found"),
        ("wrong_secret", "corpus/", "SIGNATURE_DOES_NOT_MATCH"),
        ("unreachable_endpoint", "corpus/", "connect"),
    ],
)
def test_an_input_that_cannot_be_reached_is_one_line_naming_it(
    s3, tmp_path, tiny_st, request, setting, key, said
):
    write_jsonl(tmp_path / "b.jsonl", _texts(3))
    s3.upload(tmp_path / "b.jsonl", "corpus/b.jsonl")
    if setting is not None:
        request.getfixturevalue(setting)
    uri = key if key.startswith("s3://") else f"s3://{s3.name}/{key}"
    out = tmp_path / "out"
    result = run_cli(uri, tiny_st("mean"), out)
    assert result.exit_code not in (0, None)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert uri.rstrip("/") in lines[0] and said in lines[0]
    assert "Traceback" not in result.output
    assert not out.exists()


def test_object_storage_inputs_that_are_local_only_or_empty_are_errors(s3, tmp_path):
    (tmp_path / "state.json").write_text("{}")
    write_jsonl(tmp_path / "dataset_info.json", [{"x": 1}])
    s3.upload(tmp_path / "state.json", "saved/state.json")
    s3.upload(tmp_path / "dataset_info.json", "saved/dataset_info.json")
    with pytest.raises(InputError, match="save_to_disk: those are read from a local disk only"):
        list_inputs([s3.uri("saved")])
    with pytest.raises(UsageError, match="not from object storage"):
        list_inputs([f"hf://{s3.uri('saved')}"])
    (tmp_path / "notes.txt").write_text("x")
    s3.upload(tmp_path / "notes.txt", "empty/notes.txt")
    with pytest.raises(UsageError, match=r"no input file \(\.parquet, .*\) found"):
        list_inputs([s3.uri("empty")])
    with pytest.raises(UsageError, match="unsupported input"):
        list_inputs([s3.uri("empty/notes.txt")])


class _DroppingStream(io.RawIOBase):
    """A remote stream whose connection drops after its first megabyte, as pyarrow
    reports it."""

    def __init__(self, inner):
        self.inner = inner
        self.given = 0

    def readable(self):
        return True

    def readinto(self, buffer):
        if self.given >= 1 << 20:
            raise OSError(
                "AWS Error NETWORK_CONNECTION during GetObject operation: curlCode: 56, "
                "Failure when receiving data from the peer"
            )
        data = self.inner.read(len(buffer))
        buffer[: len(data)] = data
        self.given += len(data)
        return len(data)


@pytest.mark.slow
def test_a_connection_dropped_mid_file_stops_the_run_instead_of_setting_records_aside(
    s3, tmp_path, tiny_st, monkeypatch
):
    texts = [{"id": f"d{i}", "text": r["text"]} for i, r in enumerate(_random_texts(3000))]
    uri = s3.upload(write_jsonl(tmp_path / "big.jsonl", texts), "drop/big.jsonl")
    out = tmp_path / "out"
    arguments = ["--records-per-unit", "1000", "--max-batch-tokens", "4096"]
    open_stream = ObjectPath.open_stream
    with monkeypatch.context() as patched:
        patched.setattr(ObjectPath, "open_stream", lambda self: _DroppingStream(open_stream(self)))
        result = run_cli(uri, tiny_st("mean"), out, *arguments)
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {uri}: AWS Error NETWORK_CONNECTION")
    assert not (out / "_bulkembed" / "bad_records.jsonl").exists()
    resumed = run_cli(uri, tiny_st("mean"), out, *arguments)
    assert resumed.exit_code == 0, resumed.output
    assert sorted(read_output(out)) == sorted(t["id"] for t in texts)

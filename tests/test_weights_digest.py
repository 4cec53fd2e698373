"""A local model's version is a digest of every byte of its files: weights changed in the
middle of a file, its size the same, are other weights for the export cache, a run, `--since`
and `load(OUTPUT)`; an unchanged folder is digested from its files' stats alone."""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from helpers import cosines, run_cli, sample_texts, write_jsonl

import bulkembed
from bulkembed.errors import ModelError
from bulkembed.models import file_digests
from bulkembed.models.model_files import model_version

MIB = 1 << 20
CHANGED = "embeddings.word_embeddings.weight"


def _padded(source: Path, folder: Path) -> Path:
    """A copy of the model folder `source` whose weights lie between 1.5 MiB of unused
    tensors before and after them, so that no byte of the model's own tensors is in the
    first or last MiB of `model.safetensors`."""
    from safetensors.numpy import load_file, save_file

    shutil.copytree(source, folder)
    weights = load_file(folder / "model.safetensors")
    filler = np.zeros(3 * MIB // 8, np.float32)
    padded = {"0": filler, **weights, "~": filler}
    save_file(padded, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def _tensor_bytes(path: Path, name: str) -> tuple[int, int]:
    """Where the data of tensor `name` lies in the safetensors file `path`: (start, end)."""
    with open(path, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(size))
    start, end = header[name]["data_offsets"]
    return 8 + size + start, 8 + size + end


def _change_in_place(path: Path, name: str) -> None:
    """Multiply tensor `name` (float32) by -3, writing its bytes where they are."""
    start, end = _tensor_bytes(path, name)
    with open(path, "r+b") as f:
        f.seek(start)
        values = np.frombuffer(f.read(end - start), np.float32) * np.float32(-3)
        f.seek(start)
        f.write(values.tobytes())


def _version(folder: Path) -> str:
    return model_version(str(folder), None, folder / "config.json")


def _dense(out: Path) -> np.ndarray:
    table = pq.read_table(out).sort_by("id")
    return np.array(table.column("dense").to_pylist())


@pytest.fixture
def model(tmp_path, tiny_st) -> Path:
    folder = _padded(tiny_st("mean"), tmp_path / "model")
    weights = folder / "model.safetensors"
    start, end = _tensor_bytes(weights, CHANGED)
    assert start > MIB and end < weights.stat().st_size - MIB
    return folder


def test_weights_changed_in_the_middle_are_other_weights_everywhere(tmp_path, model):
    records = [{"id": f"d{i}", "text": t} for i, t in enumerate(sample_texts(40))]
    corpus = write_jsonl(tmp_path / "c.jsonl", records)
    settings = ("--dtype", "float32")
    runs = {}
    for backend in ("openvino", "torch"):
        out = tmp_path / f"before-{backend}"
        assert run_cli(corpus, model, out, *settings, "--backend", backend).exit_code == 0
        runs[f"before-{backend}"] = _dense(out)
    before = _version(model)

    weights = model / "model.safetensors"
    size, head = weights.stat().st_size, weights.read_bytes()
    _change_in_place(weights, CHANGED)
    after = weights.read_bytes()
    assert len(after) == size and after[:MIB] == head[:MIB] and after[-MIB:] == head[-MIB:]
    assert after != head and _version(model) != before

    for backend in ("openvino", "torch"):
        out = tmp_path / f"after-{backend}"
        assert run_cli(corpus, model, out, *settings, "--backend", backend).exit_code == 0
        runs[f"after-{backend}"] = _dense(out)
    # The OpenVINO conversion is made again for the new weights, not taken from the cache:
    # both backends give the new weights' vectors, and they are not the old ones.
    assert cosines(runs["after-openvino"], runs["after-torch"]).min() > 0.9999
    assert cosines(runs["after-torch"], runs["before-torch"]).min() < 0.99
    assert cosines(runs["after-openvino"], runs["before-openvino"]).min() < 0.99

    # `--since` an output of the old weights carries none of its vectors.
    out = tmp_path / "since"
    since = ("--since", tmp_path / "before-openvino")
    result = run_cli(corpus, model, out, *settings, *since)
    summary = json.loads((out / "_bulkembed" / "summary.json").read_text())
    assert result.exit_code == 0, result.output
    assert (summary["changed"], summary["unchanged"], summary["docs_this_run"]) == (40, 0, 40)
    np.testing.assert_allclose(_dense(out), runs["after-openvino"], atol=1e-6)

    # `load(OUTPUT)` refuses the folder as other weights.
    with pytest.raises(ModelError, match=r"made with the weights sha256-whole:\w+ of .*, not"):
        bulkembed.load(tmp_path / "before-openvino")


def test_an_unchanged_folder_is_digested_from_stats_alone(tmp_path, model, monkeypatch):
    read = []
    piece_digest = file_digests._piece_digest

    def counted(piece):
        read.append(piece[0].relative_to(model).as_posix())
        return piece_digest(piece)

    monkeypatch.setattr(file_digests, "_piece_digest", counted)
    monkeypatch.setattr(file_digests, "SETTLED_NS", 0)
    first = _version(model)
    files = [p.relative_to(model).as_posix() for p in model.rglob("*") if p.is_file()]
    assert sorted(set(read)) == sorted(f for f in files if f != "README.md")
    # 3 MiB of filler and the model's own tensors: one piece of 64 MiB.
    assert read.count("model.safetensors") == 1

    read.clear()
    assert _version(model) == first and read == []

    # A file written again, its content and size the same: read again, the same digest.
    config = model / "config.json"
    config.write_bytes(config.read_bytes())
    assert _version(model) == first and read == ["config.json"]

    read.clear()
    # A file changed, its size the same and its times set back: its change time moved.
    stat = config.stat()
    config.write_text(config.read_text().replace('"gelu"', '"relu"'))
    os.utime(config, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert config.stat().st_size == stat.st_size
    assert _version(model) != first and read == ["config.json"]


def test_a_large_file_is_digested_a_piece_at_a_time(tmp_path, monkeypatch):
    import hashlib

    monkeypatch.setattr(file_digests, "PIECE", 1000)
    data = os.urandom(2500)
    (tmp_path / "w.bin").write_bytes(data)
    (tmp_path / "small").write_bytes(data[:1000])
    pieces = [hashlib.sha256(data[i : i + 1000]).digest() for i in (0, 1000, 2000)]
    found = file_digests.file_digests([tmp_path / "w.bin", tmp_path / "small"])
    assert found == [hashlib.sha256(b"".join(pieces)).hexdigest(), pieces[0].hex()]


def test_a_change_set_of_other_weights_keeps_no_vector_of_them(tmp_path, model):
    records = [{"id": f"d{i}", "text": t} for i, t in enumerate(sample_texts(20))]
    settings = ("--dtype", "float32")
    before = write_jsonl(tmp_path / "v1" / "c.jsonl", records)
    assert run_cli(before, model, tmp_path / "prev", *settings).exit_code == 0
    _change_in_place(model / "model.safetensors", CHANGED)
    # d3 cannot be read now: its row would stay, with a vector of the old weights.
    records[3]["text"] = None
    after = write_jsonl(tmp_path / "v2" / "c.jsonl", records)
    out = tmp_path / "out"
    result = run_cli(after, model, out, *settings, "--since", tmp_path / "prev")
    assert result.exit_code == 1
    assert result.output.strip() == (
        f"error: --since {tmp_path / 'prev'} was made with other weights, and 1 row of it "
        "would stay in this output as it is (a record that could not be read, or a delete "
        "--max-deletes held), with a vector of those weights; read every input whole and "
        "allow the deletes, then run again (or run without --since)"
    )
    assert not (out / "_bulkembed" / "changes" / "deletes.parquet").exists()
    # With every record read, the change set holds every document, embedded again.
    records[3]["text"] = "d3 is readable again"
    write_jsonl(tmp_path / "v2" / "c.jsonl", records)
    since = ("--since", tmp_path / "prev", "--overwrite")
    result = run_cli(after, model, out, *settings, *since)
    assert result.exit_code == 0, result.output
    upserts = pq.read_table(out / "_bulkembed" / "changes" / "upserts")
    assert sorted(upserts.column("id").to_pylist()) == sorted(r["id"] for r in records)

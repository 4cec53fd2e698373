"""Image corpora in every layout a run reads, and the images it sets aside with a reason."""

from __future__ import annotations

import io
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import read_output, run_cli

PHOTOS = 12


def _quarantine(out) -> list[dict]:
    lines = (out / "_bulkembed" / "bad_records.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


@pytest.fixture
def reference(tiny_clip, photos, tmp_path):
    """The vectors of the first photos, by file name, from a run over their folder."""
    folder = tmp_path / "reference"
    folder.mkdir()
    for photo in photos[:PHOTOS]:
        (folder / f"{photo.parent.name}-{photo.name}").write_bytes(photo.read_bytes())
    out = tmp_path / "reference-out"
    result = run_cli(folder, tiny_clip, out, "--dtype", "float32")
    assert result.exit_code == 0, result.output
    return read_output(out), sorted(folder.iterdir())


def test_a_parquet_of_image_bytes_and_one_of_datasets_images_give_the_foldersread_output(
    tiny_clip, reference, tmp_path
):
    vectors, files = reference
    names = [f.name for f in files]
    raw = [f.read_bytes() for f in files]
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    pq.write_table(pa.table({"id": names, "jpg": raw}), corpus / "bytes.parquet")
    # The `datasets` Image feature: bytes, or a path (relative to the file) without them.
    images = [
        {"bytes": None, "path": f"../{files[0].parent.name}/{name}"} if i % 2 else
        {"bytes": data, "path": name}
        for i, (name, data) in enumerate(zip(names, raw, strict=True))
    ]  # fmt: skip
    kind = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table({"id": [f"hf-{n}" for n in names], "image": pa.array(images, kind)})
    pq.write_table(table, corpus / "datasets.parquet")
    out = tmp_path / "out"
    result = run_cli(corpus, tiny_clip, out, "--image-column", "jpg", "--dtype", "float32")
    assert result.exit_code == 1, result.output
    assert "image column 'jpg' not found in" in result.output

    for name, column in (("bytes.parquet", "jpg"), ("datasets.parquet", "image")):
        out = tmp_path / f"out-{column}"
        result = run_cli(
            corpus / name, tiny_clip, out, "--image-column", column, "--dtype", "float32"
        )
        assert result.exit_code == 0, result.output
        found = read_output(out)
        assert len(found) == len(names)
        for found_id, vector in found.items():
            assert np.allclose(vector, vectors[found_id.removeprefix("hf-")], atol=1e-6)


def test_a_jsonl_of_image_paths_reads_them_from_its_folder(tiny_clip, reference, tmp_path):
    vectors, files = reference
    listing = tmp_path / "listing.jsonl"
    lines = [{"id": f.name, "path": f"reference/{f.name}"} for f in files]
    listing.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "out"
    result = run_cli(listing, tiny_clip, out, "--image-column", "path", "--dtype", "float32")
    assert result.exit_code == 0, result.output
    found = read_output(out)
    assert found.keys() == vectors.keys()
    assert all(np.allclose(found[k], vectors[k], atol=1e-6) for k in found)


def test_bad_images_are_set_aside_with_their_reason_and_the_others_embedded(
    tiny_clip, photos, tmp_path
):
    from PIL import Image

    folder = tmp_path / "photos"
    folder.mkdir()
    good = photos[0].read_bytes()
    (folder / "good.jpg").write_bytes(good)
    (folder / "truncated.jpg").write_bytes(good[: len(good) // 2])
    (folder / "empty.png").write_bytes(b"")
    (folder / "text.webp").write_bytes(b"not an image at all")
    # 5000 x 4000 pixels, over a limit of 10 million: a decompression bomb, not decoded.
    bomb = io.BytesIO()
    Image.new("L", (5000, 4000)).save(bomb, "PNG")
    (folder / "bomb.png").write_bytes(bomb.getvalue())
    out = tmp_path / "out"
    result = run_cli(folder, tiny_clip, out, "--max-image-pixels", "10000000", workers=1)
    assert result.exit_code == 0, result.output
    assert list(read_output(out)) == ["good.jpg"]
    reasons = {record["id"]: record["reason"] for record in _quarantine(out)}
    assert reasons == {
        "bomb.png": "the image has 5000x4000 pixels, more than the limit of 10000000 "
        "(--max-image-pixels)",
        "empty.png": "the image is empty (0 bytes)",
        "text.webp": "not an image of a format Pillow reads",
        "truncated.jpg": reasons["truncated.jpg"],
    }
    assert reasons["truncated.jpg"].startswith("cannot decode the image: image file is truncated")


def test_missing_paths_and_columns_of_no_image_type_are_set_aside(tiny_clip, photos, tmp_path):
    corpus = tmp_path / "corpus.parquet"
    paths = [str(photos[0]), "nowhere/missing.jpg", None]
    pq.write_table(pa.table({"id": ["a", "b", "c"], "image": paths}), corpus)
    out = tmp_path / "out"
    result = run_cli(corpus, tiny_clip, out, "--image-column", "image")
    assert result.exit_code == 0, result.output
    assert list(read_output(out)) == ["a"]
    reasons = {record["id"]: record["reason"] for record in _quarantine(out)}
    assert reasons == {"b": f"no image at {tmp_path}/nowhere/missing.jpg", "c": "image is null"}

    numbers = tmp_path / "numbers.parquet"
    pq.write_table(pa.table({"id": ["x"], "image": [7]}), numbers)
    out = tmp_path / "numbers-out"
    result = run_cli(numbers, tiny_clip, out, "--image-column", "image")
    assert result.exit_code == 0, result.output
    assert _quarantine(out)[0]["reason"] == "image column 'image' holds int64, not images"


def test_a_text_model_on_images_and_a_mixed_input_are_one_line_errors(
    tiny_st, tiny_clip, photos, tmp_path
):
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "a.jpg").write_bytes(photos[0].read_bytes())
    result = run_cli(folder, tiny_st("mean"), tmp_path / "out")
    assert result.exit_code == 2
    assert "the inputs are images, and" in result.output
    assert "reads texts only: embed them with a two-tower model" in result.output
    (folder / "texts.jsonl").write_text('{"id": "t", "text": "a red bicycle"}\n')
    result = run_cli(folder, tiny_clip, tmp_path / "out2")
    assert result.exit_code == 2
    assert "the inputs mix image files" in result.output

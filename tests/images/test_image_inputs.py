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


def test_a_text_model_on_images_is_a_one_line_error_and_texts_beside_images_are_embedded(
    tiny_st, photos, tmp_path
):
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "a.jpg").write_bytes(photos[0].read_bytes())
    result = run_cli(folder, tiny_st("mean"), tmp_path / "out")
    assert result.exit_code == 2
    assert "the inputs are images, and" in result.output
    assert "reads texts only: embed them with a two-tower model" in result.output
    # Texts beside images (a thumbnail in a folder of documents): the texts are embedded.
    (folder / "texts.jsonl").write_text('{"id": "t", "text": "a red bicycle"}\n')
    result = run_cli(folder, tiny_st("mean"), tmp_path / "out2")
    assert result.exit_code == 0, result.output
    assert list(read_output(tmp_path / "out2")) == ["t"]
    assert f"1 input of images left out ({folder}): a run embeds texts or images" in result.output


def _shard(path, samples) -> None:
    """A WebDataset shard: each sample's members (`KEY.SUFFIX`) in order."""
    import tarfile

    with tarfile.open(path, "w") as tar:
        for key, members in samples:
            for suffix, data in members.items():
                info = tarfile.TarInfo(f"{key}.{suffix}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def test_webdataset_shards_give_the_folders_vectors_and_their_captions(
    tiny_clip, reference, tmp_path
):
    vectors, files = reference
    shards = tmp_path / "shards"
    shards.mkdir()
    samples = [
        (f.stem, {"jpg": f.read_bytes(), "txt": f"caption of {f.stem}".encode()}) for f in files
    ]
    samples.insert(3, ("no-image", {"txt": b"a caption alone", "json": b"{}"}))
    _shard(shards / "00000.tar", samples[:7])
    _shard(shards / "00001.tar", samples[7:])
    # A shard cut short: its whole samples are read, the rest set aside.
    whole = (shards / "00001.tar").read_bytes()
    (shards / "00002.tar").write_bytes(whole[: len(whole) // 2])
    out = tmp_path / "out"
    arguments = ["--keep-columns", "txt", "--dtype", "float32", "--records-per-unit", "4"]
    result = run_cli(shards, tiny_clip, out, *arguments)
    assert result.exit_code == 0, result.output
    table = pq.read_table(out)
    found = read_output(out)
    assert set(found) == {f.stem for f in files}
    for key, vector in found.items():
        assert np.allclose(vector, vectors[f"{key}.jpg"], atol=1e-6)
    captions = dict(
        zip(table.column("id").to_pylist(), table.column("txt").to_pylist(), strict=True)
    )
    assert captions[files[0].stem] == f"caption of {files[0].stem}"
    reasons = [(r.get("id"), r["reason"]) for r in _quarantine(out)]
    assert ("no-image", "no image in the sample (its members: json, txt)") in reasons
    cut = [reason for _, reason in reasons if reason.startswith("unreadable after sample")]
    duplicates = [key for key, reason in reasons if reason.startswith("duplicate id")]
    assert len(cut) == 1 and len(duplicates) >= 1


def test_a_datasets_image_column_is_read_streamed_and_saved_to_disk(tiny_clip, reference, tmp_path):
    import datasets

    vectors, files = reference
    table = {"id": [f.name for f in files], "image": [str(f) for f in files]}
    dataset = datasets.Dataset.from_dict(table).cast_column("image", datasets.Image())
    (tmp_path / "hub" / "data").mkdir(parents=True)
    dataset.to_parquet(tmp_path / "hub" / "data" / "train-00000.parquet")
    dataset.save_to_disk(tmp_path / "saved")
    for name, source in (("hub", f"hf://{tmp_path / 'hub'}"), ("saved", tmp_path / "saved")):
        out = tmp_path / f"out-{name}"
        result = run_cli(source, tiny_clip, out, "--image-column", "image", "--dtype", "float32")
        assert result.exit_code == 0, result.output
        found = read_output(out)
        assert found.keys() == vectors.keys()
        assert all(np.allclose(found[k], vectors[k], atol=1e-6) for k in found)


@pytest.mark.parametrize("argument", ["photos/", "photos/*.jpg", "photos/sub/", "table"])
def test_images_on_object_storage_give_the_local_vectors(
    tiny_clip, reference, s3, tmp_path, argument
):
    vectors, files = reference
    for number, file in enumerate(files):
        s3.upload(file, f"photos/{'sub/' if number % 2 else ''}{file.name}")
    # A table beside the photos naming them by relative paths.
    names = [f"{'sub/' if i % 2 else ''}{f.name}" for i, f in enumerate(files)]
    if argument == "table":
        table = tmp_path / "paths.parquet"
        pq.write_table(pa.table({"id": [f.name for f in files], "image": names}), table)
        s3.upload(table, "photos/paths.parquet")
    source = s3.uri("photos/paths.parquet") if argument == "table" else s3.uri(argument)
    options = ["--image-column", "image"] if argument == "table" else []
    out = tmp_path / "out"
    result = run_cli(source, tiny_clip, out, "--dtype", "float32", *options)
    assert result.exit_code == 0, result.output
    found = read_output(out)
    expected = {
        "photos/": {n: vectors[n.rpartition("/")[2]] for n in names},
        "photos/*.jpg": {f.name: vectors[f.name] for f in files[::2]},
        "photos/sub/": {f.name: vectors[f.name] for f in files[1::2]},
        "table": vectors,
    }[argument]
    assert found.keys() == expected.keys()
    assert all(np.allclose(found[k], expected[k], atol=1e-6) for k in expected)


def test_a_kept_value_that_does_not_fit_its_column_sets_its_image_aside(
    tiny_clip, photos, tmp_path
):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    raw = [p.read_bytes() for p in photos[:3]]
    # `n` is int64 in one file and float64 in the other: float64 over both, which an
    # integer past 2^53 does not fit.
    first = {"id": ["a", "b"], "image": raw[:2], "n": [1, 2**60 + 1]}
    pq.write_table(pa.table(first), corpus / "a.parquet")
    pq.write_table(pa.table({"id": ["c"], "image": raw[2:], "n": [0.5]}), corpus / "b.parquet")
    out = tmp_path / "out"
    arguments = ["--image-column", "image", "--keep-columns", "n"]
    result = run_cli(corpus, tiny_clip, out, *arguments)
    assert result.exit_code == 0, result.output
    assert sorted(read_output(out)) == ["a", "c"]
    (record,) = _quarantine(out)
    assert record["id"] == "b" and record["reason"].startswith("--keep-columns 'n' holds ")

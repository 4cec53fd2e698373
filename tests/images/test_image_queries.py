"""The query side of an image output: text queries through the text tower of the model the
output recorded, images through its image tower, in Python, LanceDB and the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import read_output, run_cli
from typer.testing import CliRunner

import bulkembed
from bulkembed.cli import app
from bulkembed.errors import UsageError

QUERIES = ["a red bicycle", "two dogs play in the snow", "a bowl of soup on a table"]


@pytest.fixture(scope="module")
def photo_dir(photos, tmp_path_factory):
    folder = tmp_path_factory.mktemp("photos")
    for photo in photos[:40]:
        (folder / f"{photo.parent.name}-{photo.name}").write_bytes(photo.read_bytes())
    return folder


def test_an_image_output_embeds_texts_and_images_as_its_run_did(
    tiny_siglip, tiny_st, photo_dir, tmp_path
):
    from PIL import Image

    out = tmp_path / "out"
    assert run_cli(photo_dir, tiny_siglip, out, "--dtype", "float32").exit_code == 0
    vectors = read_output(out)
    files = sorted(photo_dir.iterdir())[:3]
    with bulkembed.load(str(out), dtype="float32") as encoder:
        by_path = np.array(encoder.embed_images(files))
        by_bytes = np.array(encoder.embed_images([f.read_bytes() for f in files]))
        with Image.open(files[0]) as image:
            by_pil = np.array(encoder.embed_images(image))
        query = np.array(encoder.embed_query(QUERIES[0]))
        texts = np.array(encoder.embed_documents(QUERIES[:1]))
    expected = np.array([vectors[f.name] for f in files])
    assert np.allclose(by_path, expected, atol=1e-6)
    assert np.allclose(by_bytes, expected, atol=1e-6)
    assert np.allclose(by_pil, expected[:1], atol=1e-6)
    assert query.shape == (32,) and np.allclose(texts[0], query, atol=1e-6)

    with pytest.raises(UsageError, match="reads texts only; load a two-tower model"):
        bulkembed.load(str(tiny_st("mean"))).embed_images(files)


def test_a_lancedb_image_table_searches_by_text_and_by_image(tiny_clip, photo_dir, tmp_path):
    import lancedb
    from PIL import Image

    import bulkembed.lancedb  # noqa: F401 (registers the table's embedding function)

    database = tmp_path / "db"
    out = f"lancedb://{database}?table=photos"
    result = run_cli(photo_dir, tiny_clip, out, "--dtype", "float32")
    assert result.exit_code == 0, result.output
    table = lancedb.connect(database).open_table("photos")
    stored = table.to_arrow()
    ids = stored.column("id").to_pylist()
    matrix = np.array(stored.column("vector").to_pylist())
    encoder = bulkembed.load(out)
    for text in QUERIES:
        query = np.array(encoder.embed_query(text))
        expected = [ids[i] for i in np.argsort(-(matrix @ query), kind="stable")[:5]]
        found = table.search(text).limit(5).to_arrow().column("id").to_pylist()
        assert found == expected
    first = sorted(photo_dir.iterdir())[7]
    with Image.open(first) as image:
        nearest = table.search(image).limit(1).to_arrow()
    assert nearest.column("id").to_pylist() == [first.name]
    # The table's function embeds with `--dtype auto` (bfloat16 where the CPU has it).
    assert nearest.column("_distance").to_pylist()[0] < 1e-3


def test_embed_image_prints_the_vectors_a_run_writes(tiny_clip, photo_dir, tmp_path):
    out = tmp_path / "out"
    assert run_cli(photo_dir, tiny_clip, out, "--dtype", "float32").exit_code == 0
    vectors = read_output(out)
    files = sorted(photo_dir.iterdir())[:2]
    arguments = ["embed", "--model", str(tiny_clip), "--dtype", "float32"]
    result = CliRunner().invoke(
        app, [*arguments, "--image", str(files[0]), "--image", str(files[1])]
    )
    assert result.exit_code == 0, result.output
    rows = [json.loads(line)["dense"] for line in result.stdout.splitlines()]
    assert np.allclose(rows, [vectors[f.name] for f in files], atol=1e-6)
    both = CliRunner().invoke(app, [*arguments, "a text", "--image", str(files[0])])
    assert both.exit_code == 2
    assert "pass the texts to embed, or --image PATH for images: one of them" in both.output

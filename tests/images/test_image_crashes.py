"""A 2,000-image run killed at 10 random points, then run again: every image once, with the
vectors of an uninterrupted run; and `--since` after images were edited, deleted and added
embeds exactly those and carries the rest."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fault_harness import run_forked
from helpers import read_output, run_arguments, run_cli

IMAGES = 2000
# Where a run is killed: a decoded chunk reached the run, a batch is about to run, rows
# went into a temporary part, a part was renamed but its unit not marked, a unit marked.
STAGES = ("tokenize", "encode", "write", "commit", "marked")


def _image_corpus(photos: list[Path], folder: Path, count: int) -> Path:
    """`count` small JPEG crops of the photos, each of its own place in its photo."""
    from PIL import Image

    opened = [Image.open(p).convert("RGB") for p in photos]
    for number in range(count):
        photo = opened[number % len(opened)]
        left = (number * 37) % (photo.width - 96)
        top = (number * 53) % (photo.height - 72)
        # 500 images a subfolder: ids are paths such as `1/00512.jpg`.
        target = folder / str(number // 500) / f"{number:05d}.jpg"
        target.parent.mkdir(parents=True, exist_ok=True)
        photo.crop((left, top, left + 96, top + 72)).save(target, quality=85)
    return folder


def _arguments(corpus: Path, model: Path, out: Path, *extra: str) -> list[str]:
    return [
        "run", str(corpus), "--model", str(model), "--output", str(out), "--quiet",
        "--dtype", "float32", "--tokenize-workers", "0", "--max-batch-tokens", "800",
        "--records-per-unit", "100", *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def corpus(photos, tmp_path_factory) -> Path:
    return _image_corpus(photos, tmp_path_factory.mktemp("images") / "corpus", IMAGES)


@pytest.mark.slow
def test_a_run_killed_at_ten_points_ends_with_every_image_once(corpus, tiny_clip, tmp_path):
    from typer.testing import CliRunner

    from bulkembed.cli import app

    reference = tmp_path / "reference"
    result = CliRunner().invoke(app, _arguments(corpus, tiny_clip, reference))
    assert result.exit_code == 0, result.output
    expected = read_output(reference)
    assert len(expected) == IMAGES

    out = tmp_path / "out"
    arguments = _arguments(corpus, tiny_clip, out)
    chosen = random.Random(45)
    killed = 0
    for _ in range(10):
        stage = chosen.choice(STAGES)
        # A stage is passed about once a unit or more: 20 units, 32 chunks, 125 batches.
        killed_run = run_forked(stage, chosen.randint(1, 6), "SIGKILL", arguments)
        assert killed_run.returncode in (-9, 0), killed_run.stderr
        killed += killed_run.returncode == -9
    assert killed >= 8
    final = CliRunner().invoke(app, arguments)
    assert final.exit_code == 0, final.output
    found = read_output(out)
    assert found.keys() == expected.keys()
    worst = max(float(np.abs(np.subtract(found[k], expected[k])).max()) for k in expected)
    assert worst <= 1e-6


def test_since_embeds_the_edited_deleted_and_added_images_and_carries_the_rest(
    photos, tiny_clip, tmp_path
):
    import json
    import shutil

    from PIL import Image

    first = _image_corpus(photos, tmp_path / "v1", 60)
    second = tmp_path / "v2"
    shutil.copytree(first, second)
    images = sorted(second.rglob("*.jpg"))
    for path in images[:5]:
        with Image.open(path) as image:
            image.transpose(Image.Transpose.FLIP_LEFT_RIGHT).save(path, quality=85)
    for path in images[10:13]:
        path.unlink()
    for number in range(4):
        shutil.copyfile(photos[number], second / "0" / f"new-{number}.jpg")
    old, new = tmp_path / "old", tmp_path / "new"
    assert run_cli(first, tiny_clip, old, "--dtype", "float32").exit_code == 0
    result = run_cli(second, tiny_clip, new, "--dtype", "float32", "--since", old)
    assert result.exit_code == 0, result.output
    summary = json.loads((new / "_bulkembed" / "summary.json").read_text())
    counts = {k: summary[k] for k in ("new", "changed", "unchanged", "deleted")}
    assert counts == {"new": 4, "changed": 5, "unchanged": 52, "deleted": 3}
    assert summary["docs_embedded"] == 9
    rebuild = tmp_path / "rebuild"
    assert run_cli(second, tiny_clip, rebuild, "--dtype", "float32").exit_code == 0
    expected = read_output(rebuild)
    found = read_output(new)
    assert found.keys() == expected.keys()
    assert all(np.allclose(found[k], expected[k], atol=1e-6) for k in expected)


def test_a_lancedb_image_table_synced_in_place_holds_the_rebuilds_vectors(
    photos, tiny_clip, tmp_path
):
    import shutil

    import lancedb
    from PIL import Image

    folder = _image_corpus(photos, tmp_path / "photos", 40)
    table = f"lancedb://{tmp_path / 'db'}?table=photos"
    assert run_cli(folder, tiny_clip, table, "--dtype", "float32").exit_code == 0
    images = sorted(folder.rglob("*.jpg"))
    with Image.open(images[0]) as image:
        image.rotate(90).save(images[0], quality=85)
    images[1].unlink()
    shutil.copyfile(photos[0], folder / "0" / "added.jpg")
    result = run_cli(folder, tiny_clip, table, "--dtype", "float32", "--since", table)
    assert result.exit_code == 0, result.output
    rebuild = tmp_path / "rebuild"
    assert run_cli(folder, tiny_clip, rebuild, "--dtype", "float32").exit_code == 0
    expected = read_output(rebuild)
    rows = lancedb.connect(tmp_path / "db").open_table("photos").to_arrow()
    found = dict(zip(rows.column("id").to_pylist(), rows.column("vector").to_pylist(), strict=True))
    assert found.keys() == expected.keys() and len(found) == 40
    assert all(np.allclose(found[k], expected[k], atol=1e-6) for k in expected)


def test_images_stream_to_stdout_and_quantize_as_texts_do(photos, tiny_clip, tmp_path):
    import io

    import pyarrow as pa

    folder = _image_corpus(photos, tmp_path / "photos", 20)
    plain = tmp_path / "plain"
    assert run_cli(folder, tiny_clip, plain, "--dtype", "float32").exit_code == 0
    expected = read_output(plain)
    arguments = run_arguments(folder, tiny_clip, "-", "--stream-format", "arrow", "--quiet")
    streamed = subprocess.run(
        [sys.executable, "-m", "bulkembed", *arguments], capture_output=True, timeout=300
    )
    assert streamed.returncode == 0, streamed.stderr.decode()
    table = pa.ipc.open_stream(io.BytesIO(streamed.stdout)).read_all()
    found = dict(
        zip(table.column("id").to_pylist(), table.column("dense").to_pylist(), strict=True)
    )
    assert found.keys() == expected.keys()
    assert all(np.allclose(found[k], expected[k], atol=1e-6) for k in expected)
    quantized = tmp_path / "int8"
    result = run_cli(folder, tiny_clip, quantized, "--dtype", "float32", "--quantize", "int8")
    assert result.exit_code == 0, result.output
    codes = read_output(quantized)
    assert all(len(codes[k]) == 24 and all(-128 <= c <= 127 for c in codes[k]) for k in codes)

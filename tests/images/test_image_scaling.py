"""An image folder split by `--shard` and embedded by `--engine ray` gives what one process
gives: every image once, the same vectors."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from helpers import ROOT, read_output, run_arguments, run_cli

pytestmark = pytest.mark.slow

IMAGES = 60


@pytest.fixture(scope="module")
def folder(photos, tmp_path_factory):
    """60 photos, in two subfolders."""
    corpus = tmp_path_factory.mktemp("images")
    for number, photo in enumerate(photos[:IMAGES]):
        (corpus / str(number % 2)).mkdir(exist_ok=True)
        (corpus / str(number % 2) / f"{number:03d}.jpg").write_bytes(photo.read_bytes())
    return corpus


def _same(found: dict, expected: dict) -> None:
    assert found.keys() == expected.keys() and len(found) == IMAGES
    assert all(np.allclose(found[k], expected[k], atol=1e-6) for k in expected)


def test_shards_and_ray_write_what_one_process_writes(folder, tiny_clip, tmp_path):
    options = ("--dtype", "float32", "--records-per-unit", "8")
    one = tmp_path / "one"
    assert run_cli(folder, tiny_clip, one, *options).exit_code == 0
    expected = read_output(one)

    shared = tmp_path / "shared"
    for shard in ("0/2", "1/2"):
        result = run_cli(folder, tiny_clip, shared, *options, "--shard", shard)
        assert result.exit_code == 0, result.output
    _same(read_output(shared), expected)

    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    environment = {**os.environ, "PYTHONPATH": path}
    environment.pop("RAY_ADDRESS", None)
    arguments = run_arguments(folder, tiny_clip, tmp_path / "ray", *options, "--engine", "ray")
    ran = subprocess.run(
        [sys.executable, "-m", "bulkembed", *arguments],
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert ran.returncode == 0, ran.stderr
    _same(read_output(tmp_path / "ray"), expected)

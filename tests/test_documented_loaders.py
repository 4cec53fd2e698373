"""The loaders docs/outputs.md shows, run as written there against Qdrant's local mode (the
client's `QdrantClient("localhost")` pointed at a folder): every document lands once, under
its UUID, with the vector the output holds."""

import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from helpers import ROOT, records, run_cli, write_parquet
from qdrant_client import QdrantClient

LOCAL = 'QdrantClient(path="qdrant")'


def _snippet(after: str) -> str:
    """The first Python block after the line `after` in docs/outputs.md, its client local."""
    page = (ROOT / "docs" / "outputs.md").read_text()
    code = page.split(after, 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert 'QdrantClient("localhost")' in code
    return code.replace('QdrantClient("localhost")', LOCAL)


def _assert_loaded(folder: Path, out: Path, tolerance: float) -> None:
    """The collection in `folder` holds each row of `out` once, under its id's UUID, with
    its vector (Qdrant keeps cosine vectors normalised; bulkembed's already are)."""
    client = QdrantClient(path=str(folder / "qdrant"))
    found, _ = client.scroll("docs", limit=10_000, with_vectors=True)
    client.close()
    for point in found:
        assert point.id == str(uuid.uuid5(uuid.NAMESPACE_URL, point.payload["doc_id"]))
    loaded = {p.payload["doc_id"]: p.vector for p in found}
    table = pq.read_table(out)
    ids, vectors = table.column("id").to_pylist(), table.column("dense").to_pylist()
    assert len(found) == len(ids) and sorted(loaded) == sorted(ids)
    for doc_id, vector in zip(ids, vectors, strict=True):
        np.testing.assert_allclose(loaded[doc_id], vector, rtol=tolerance, atol=tolerance)


@pytest.fixture
def out(tmp_path, tiny_st):
    write_parquet(tmp_path / "corpus" / "a.parquet", records(30), row_group_size=10)
    result = run_cli(tmp_path / "corpus", tiny_st("mean"), tmp_path / "out")
    assert result.exit_code == 0, result.output
    return tmp_path / "out"


def test_the_parquet_loader(tmp_path, out, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(_snippet("## Loading the Parquet output"), "docs/outputs.md", "exec"), {})
    _assert_loaded(tmp_path, out, 1e-6)


def test_the_stream_loader(tmp_path, out, tiny_st):
    (tmp_path / "my_loader.py").write_text(_snippet("## stdout"))
    bulkembed = str(Path(sys.executable).with_name("bulkembed"))
    command = [bulkembed, "run", "corpus", "--model", str(tiny_st("mean")), "--output", "-"]
    run = subprocess.Popen([*command, "--quiet"], cwd=tmp_path, stdout=subprocess.PIPE)
    loader = subprocess.run(
        [sys.executable, "my_loader.py"], cwd=tmp_path, stdin=run.stdout, capture_output=True
    )
    assert run.wait() == 0 and loader.returncode == 0, loader.stderr
    # Another run of the same model: its vectors equal the Parquet output's but for rounding.
    _assert_loaded(tmp_path, out, 1e-5)

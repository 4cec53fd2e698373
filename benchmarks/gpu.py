"""GPU throughput of `bulkembed run`: tokens/s, model FLOP utilization, device busy time, for
padded and flat batches.

Runs the CLI end to end on a real-text corpus (`corpus.py`, `--copies` times with distinct
ids) with a real model on every CUDA device, in bfloat16, the token budget tuned to the free
memory, dense vectors only (`--outputs` for more), once per batch layout of `--attention`
(padded, flat: documents end to end with variable-length attention): one warm-up run per
layout on the first `--warmup-docs` documents, then `--repeats` rounds of timed runs, the
layouts interleaved in each round. Prints one JSON line on stdout: per layout, the median
and each repeat of:

- tokens_per_s while embedding (the run's `summary.json`) and end to end (wall clock);
- gpu_busy_fraction: NVML's utilization (the share of time a kernel ran, not how full the
  SMs were), sampled on a thread during the timed runs; null without `pynvml`;
- mfu: the corpus's forward FLOPs (`forward_flops`, over each document's own token count)
  per second over the devices' dense data-sheet peak (`PEAK_TFLOPS` or `--peak-tflops`).

FLOPs count the transformer up to its last hidden state, over real tokens only (padding is
work a padded batch does in vain): with `--outputs` beyond dense, the time of the extra
heads lowers the MFU. `flat_over_padded` is the ratio of the medians of tokens/s.

    HF_HUB_OFFLINE=1 python benchmarks/gpu.py [--model BAAI/bge-m3] [--docs 5000 --copies 20]
        [--attention padded,flat]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corpus import build, write
from memory import measure

if TYPE_CHECKING:
    import torch

# Data sheet, dense, no sparsity: TFLOP/s per device in bfloat16 (float16 is the same), by a
# pattern of the CUDA device name; the first match wins. NVL boards have other figures.
PEAK_TFLOPS = (
    (r"H100.*PCIe", 756.0),
    (r"H100(?!.*NVL)", 989.0),  # SXM
    (r"H200(?!.*NVL)", 989.0),
    (r"A100", 312.0),
    (r"\bL40S\b", 362.0),
    (r"\bL4\b", 121.0),
    (r"\bA10\b", 125.0),
)
SAMPLE_SECONDS = 0.1
# Figures of each timed run reported as their median.
MEDIANS = (
    "wall_seconds",
    "tokens_per_s",
    "tokens_per_s_end_to_end",
    "gpu_busy_fraction",
    "host_clock_idle_fraction",
)


def forward_flops(lengths: Iterable[int], matmul_weights: int, hidden: int, layers: int) -> int:
    """Forward FLOPs of a transformer encoder over documents of these token counts. A
    document of n tokens costs 2 × matmul_weights × n in its linear layers and
    4 × n² × hidden × layers in attention (QKᵀ and AV, 2 FLOPs per multiply-add), so the
    sum is over documents, not n times the mean length: attention per token grows with n.

    bge-base (85M weights in linear layers, width 768, 12 layers), one document of 512
    tokens, then two of 100 and 300 against two of 200, as many tokens:

    >>> forward_flops([512], matmul_weights=84_934_656, hidden=768, layers=12) / 1e9
    96.63676416
    >>> forward_flops([100, 300], 1, 1, 1), forward_flops([200, 200], 1, 1, 1)
    (400800, 320800)
    """
    return sum(2 * matmul_weights * n + 4 * n * n * hidden * layers for n in lengths)


def matmul_weights(model: torch.nn.Module) -> int:
    """Weights of the linear layers on the way to the last hidden state (the pooler, run on
    one token per document and unused, left out)."""
    import torch

    return sum(
        module.weight.numel()
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and "pooler" not in name
    )


def corpus_flops(model: str, texts: list[str]) -> tuple[int, list[int], int]:
    """Forward FLOPs of `model` over `texts`, each text's token count as `bulkembed run`
    tokenizes it (prompt, special tokens, truncation), and the max length it truncates at."""
    import torch
    from transformers import AutoConfig, AutoModel

    from bulkembed.config import RunConfig
    from bulkembed.model_spec import resolve_model
    from bulkembed.tokenize import TextTokenizer, TokenizerSettings

    spec = resolve_model(RunConfig(inputs=("-",), output="-", model=model))
    settings = TokenizerSettings(
        spec.tokenizer_json, spec.max_length, spec.prompt, spec.lowercase, spec.prefix_token_id
    )
    lengths = TextTokenizer(settings)(texts)[1].tolist()
    config = AutoConfig.from_pretrained(model)
    with torch.device("meta"):
        weights = matmul_weights(AutoModel.from_config(config))
    flops = forward_flops(lengths, weights, config.hidden_size, config.num_hidden_layers)
    return flops, lengths, spec.max_length


def peak_tflops(device: str, given: float | None) -> tuple[float | None, str]:
    """The dense peak TFLOP/s of one device, and where the figure comes from.

    >>> peak_tflops("NVIDIA H100 PCIe", None)[0], peak_tflops("NVIDIA A100-SXM4-80GB", None)[0]
    (756.0, 312.0)
    >>> peak_tflops("NVIDIA L40", None)
    (None, "no data-sheet peak known for 'NVIDIA L40': pass --peak-tflops")
    """
    if given:
        return given, "--peak-tflops"
    for pattern, tflops in PEAK_TFLOPS:
        if re.search(pattern, device, re.IGNORECASE):
            return tflops, "data sheet, dense, no sparsity"
    return None, f"no data-sheet peak known for {device!r}: pass --peak-tflops"


@contextmanager
def nvml_utilization(devices: list[int]) -> Iterator[list[list[int]]]:
    """Samples of NVML utilization.gpu (percent) of each device, every `SAMPLE_SECONDS`,
    taken on a thread while the block runs."""
    import pynvml

    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in devices]
    samples: list[list[int]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(SAMPLE_SECONDS):
            samples.append([pynvml.nvmlDeviceGetUtilizationRates(h).gpu for h in handles])

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join()
        pynvml.nvmlShutdown()


def nvml_indices(count: int) -> list[int]:
    """NVML's indices of the CUDA devices the run sees (CUDA_VISIBLE_DEVICES, when numeric)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
    numeric = all(v.strip().isdigit() for v in visible)
    return [int(v) for v in visible][:count] if numeric else list(range(count))


def timed_run(corpus: list[Path], out: Path, model: str, options: list[str]) -> dict[str, Any]:
    """One `bulkembed run` into `out` (removed after): its figures, and each device's busy
    fraction when NVML can be sampled."""
    import torch

    sampled = nvml_indices(torch.cuda.device_count()) if find_spec("pynvml") else []
    with nvml_utilization(sampled) if sampled else nullcontext([]) as samples:
        run = measure(corpus, out, model, *options)
    shutil.rmtree(out)
    busy = [round(sum(d) / len(d) / 100, 3) for d in zip(*samples, strict=True)]
    return {
        **run,
        "tokens_per_s_end_to_end": round(run["tokens"] / run["wall_seconds"], 1),
        "gpu_busy_fraction": round(statistics.mean(busy), 3) if busy else None,
        "gpu_busy_per_device": busy or None,
        "host_clock_idle_fraction": run["device_idle_fraction"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="BAAI/bge-m3")
    parser.add_argument("--docs", type=int, default=5000)
    parser.add_argument("--copies", type=int, default=20)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--max-batch-tokens", default="auto")
    parser.add_argument("--outputs", default="dense", help="passed to bulkembed run")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument(
        "--attention", default="padded,flat", help="batch layouts to compare, comma-separated"
    )
    parser.add_argument("--warmup-docs", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--peak-tflops", type=float, help="dense TFLOP/s of one device")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this benchmark measures GPUs (see throughput.py)")

    options = ["--devices", "auto", "--dtype", args.dtype, "--outputs", args.outputs]
    options += ["--max-batch-tokens", args.max_batch_tokens]
    options += ["--compile"] if args.compile else []
    records = build(args.docs, args.copies)
    flops, lengths, max_length = corpus_flops(args.model, [r["text"] for r in records])
    devices = torch.cuda.device_count()
    name = torch.cuda.get_device_name(0)
    peak, peak_source = peak_tflops(name, args.peak_tflops)
    layouts = [name.strip() for name in args.attention.split(",") if name.strip()]
    runs: dict[str, list[dict[str, Any]]] = {layout: [] for layout in layouts}
    with tempfile.TemporaryDirectory() as tmp:
        corpus = write(records, Path(tmp) / "corpus", files=8, fmt="jsonl")
        for layout in layouts:
            print(f"warm-up, {layout}: {args.warmup_docs} documents", file=sys.stderr)
            warmup = [*options, "--attention", layout, "--limit", str(args.warmup_docs)]
            measure(corpus, Path(tmp) / "warmup", args.model, *warmup)
            shutil.rmtree(Path(tmp) / "warmup")
        for repeat in range(args.repeats):
            for layout in layouts:
                print(
                    f"run {repeat + 1}/{args.repeats}, {layout}: {len(records)} documents",
                    file=sys.stderr,
                )
                layout_options = [*options, "--attention", layout]
                runs[layout].append(
                    timed_run(corpus, Path(tmp) / "out", args.model, layout_options)
                )
    tokens = sum(lengths)
    for layout, found in runs.items():
        if found[0]["tokens"] != tokens:
            print(
                f"FLOPs counted {tokens} tokens, the {layout} run {found[0]['tokens']}",
                file=sys.stderr,
            )

    def mfu(tokens_per_s: float | None) -> float | None:
        if peak is None or tokens_per_s is None:
            return None
        return round(flops / tokens * tokens_per_s / (peak * 1e12 * devices), 3)

    def figures(found: list[dict[str, Any]]) -> dict[str, Any]:
        def median(key: str) -> float | None:
            values = [r[key] for r in found if r[key] is not None]
            return round(statistics.median(values), 3) if values else None

        return {
            "attention": found[0]["attention"],
            "padding_efficiency": found[0]["padding_efficiency"],
            **{k: median(k) for k in MEDIANS},
            "mfu": mfu(median("tokens_per_s")),
            "mfu_end_to_end": mfu(median("tokens_per_s_end_to_end")),
            "repeats": [
                {
                    k: r[k]
                    for k in (*MEDIANS, "gpu_busy_per_device", "max_batch_tokens", "peak_rss_mb")
                }
                for r in found
            ],
        }

    by_layout = {layout: figures(found) for layout, found in runs.items()}
    first = runs[layouts[0]][0]
    results = {
        "device": name,
        "devices": devices,
        "model": args.model,
        "outputs": args.outputs,
        "compile": args.compile,
        **{k: first[k] for k in ("dtype", "docs", "tokens")},
        "max_length": max_length,
        "mean_tokens": round(tokens / len(lengths), 1),
        "warmup_docs": args.warmup_docs,
        "gpu_busy_source": (
            f"NVML utilization.gpu, every {SAMPLE_SECONDS} s"
            if find_spec("pynvml")
            else "not measured: pynvml not installed (pip install nvidia-ml-py)"
        ),
        "model_tflops": round(flops / 1e12, 1),
        "gflops_per_token": round(flops / tokens / 1e9, 4),
        "peak_tflops_per_device": peak,
        "peak_source": peak_source,
        "layouts": by_layout,
    }
    if {"padded", "flat"} <= by_layout.keys():
        padded, flat = (by_layout[k]["tokens_per_s"] for k in ("padded", "flat"))
        results["flat_over_padded"] = round(flat / padded, 3) if padded and flat else None
    print(json.dumps(results))


if __name__ == "__main__":
    main()

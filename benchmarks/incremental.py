"""What an incremental run costs at scale: `bulkembed run --since` against a full run.

Builds synthetic corpora of short documents (3 to 12 words from a fixed vocabulary, seeded)
as Parquet, at two sizes, and a tiny random BERT (2 layers, width 32: the cost measured is
everything but the model), converted for the CPU backend by a warm-up run first. At each
size it runs, one after another, and prints one JSON object:

- a full run (wall seconds, peak resident memory of bulkembed and its workers);
- a `--since` run of the same corpus against that output, with nothing changed (no-op);
- a `--since` run of a copy of the corpus with 1% of its texts changed;
- the floor: a plain Python script that reads the same Parquet and hashes every text
  (BLAKE2b-128, the hash bulkembed keeps), as a process of its own.

    HF_HUB_OFFLINE=1 python benchmarks/incremental.py [--sizes 100000,1000000]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from check_models import minilm_shaped
from memory import run_sampled

FILES = 4
WORDS = 5000


def corpus_texts(docs: int, seed: int = 0) -> list[str]:
    """`docs` texts of 3 to 12 words each, words drawn from a fixed made-up vocabulary."""
    rng = np.random.default_rng(seed)
    vocabulary = np.array([f"w{i:x}" for i in range(WORDS)], dtype=object)
    lengths = rng.integers(3, 13, docs)
    words = vocabulary[rng.integers(0, WORDS, int(lengths.sum()))]
    ends = np.cumsum(lengths)
    return [" ".join(words[end - n : end]) for n, end in zip(lengths, ends, strict=True)]


def write_corpus(texts: list[str], folder: Path) -> list[Path]:
    """The texts as `FILES` Parquet files (`id`, `text`), ids `d0`, `d1`, ..."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    per_file = -(-len(texts) // FILES)
    for number in range(FILES):
        start = number * per_file
        chunk = texts[start : start + per_file]
        ids = [f"d{i}" for i in range(start, start + len(chunk))]
        path = folder / f"part-{number}.parquet"
        pq.write_table(pa.table({"id": ids, "text": chunk}), path, row_group_size=65536)
        paths.append(path)
    return paths


def changed(texts: list[str], fraction: float) -> list[str]:
    """A copy of `texts` with every `1 / fraction`-th text changed."""
    step = round(1 / fraction)
    return [t + " changed" if i % step == 0 else t for i, t in enumerate(texts)]


def timed(command: list[str]) -> dict[str, float]:
    """Run `command`; its wall seconds and the peak resident memory of its process tree."""
    seconds, peak = run_sampled(command, 0.05)
    return {"seconds": round(seconds, 2), "peak_rss_mb": round(peak, 1)}


FLOOR = textwrap.dedent(
    """
    import hashlib, sys
    import pyarrow.parquet as pq
    count = 0
    for path in sys.argv[1:]:
        for text in pq.read_table(path, columns=["text"]).column("text").to_pylist():
            hashlib.blake2b(text.encode(), digest_size=16).digest()
            count += 1
    print(count, file=sys.stderr)
    """
)


def run(corpus: list[Path], model: Path, out: Path, *options: str) -> dict[str, object]:
    """`bulkembed run` of `corpus` into `out`: its time, memory and summary figures."""
    bulkembed = str(Path(sys.executable).with_name("bulkembed"))
    command = [bulkembed, "run", *map(str, corpus), "--model", str(model), "--output", str(out)]
    figures: dict[str, object] = dict(timed([*command, "--quiet", *options]))
    summary = json.loads((out / "_bulkembed" / "summary.json").read_text())
    for key in ("docs", "docs_this_run", "tokens", "startup_seconds", "stage_seconds"):
        if key in summary:
            figures[key] = summary[key]
    return figures


def measure(size: int, model: Path, tmp: Path) -> dict[str, object]:
    """Every figure at one corpus size."""
    texts = corpus_texts(size)
    corpus = write_corpus(texts, tmp / f"corpus-{size}")
    edited = write_corpus(changed(texts, 0.01), tmp / f"edited-{size}")
    del texts
    full = tmp / f"full-{size}"
    figures = {"full": run(corpus, model, full)}
    figures["noop_since"] = run(corpus, model, tmp / f"noop-{size}", "--since", str(full))
    figures["changed_1pct_since"] = run(edited, model, tmp / f"edit-{size}", "--since", str(full))
    figures["floor"] = timed([sys.executable, "-c", FLOOR, *map(str, corpus)])
    floor = figures["floor"]["seconds"]
    figures["noop_over_floor"] = round(figures["noop_since"]["seconds"] / floor, 2)
    return figures


def cpu_name() -> str:
    """The CPU's model name (Linux), else the machine's architecture."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    except OSError:
        pass
    return platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100000,1000000")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    results: dict[str, object] = {"cpu": cpu_name()}
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        model = minilm_shaped(tmp / "model", tiny=True)
        # The first run converts the model for the CPU backend; the runs measured find it done.
        warm = write_corpus(corpus_texts(1000, seed=1), tmp / "warm")
        run(warm, model, tmp / "warm-out")
        for size in sizes:
            results[str(size)] = measure(size, model, tmp)
    if len(sizes) > 1:
        small, large = results[str(sizes[0])], results[str(sizes[-1])]
        for run_name in ("full", "noop_since"):
            ratio = large[run_name]["peak_rss_mb"] / small[run_name]["peak_rss_mb"]
            results[f"{run_name}_rss_ratio"] = round(ratio, 3)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

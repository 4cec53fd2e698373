"""What the digest of a model's every byte costs (`model_files.model_version`): a folder of
`--gigabytes` of weights (random bytes, as big as BGE-M3's 2.3 GB) and a config, digested

- cold: the file's pages dropped from the operating system's cache
  (`posix_fadvise(DONTNEED)`), nothing remembered: read from the disk;
- read: its pages cached, nothing remembered (the memo removed): hashing alone;
- remembered: the memo of an earlier digest: a stat per file.

Prints one JSON object (seconds of each, GB/s, the CPU). The folder and the memo live in a
temporary folder, removed at the end.

    python benchmarks/weights_digest.py [--gigabytes 2.3] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

_BLOCK = 64 << 20


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _write(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        left = size
        while left:
            block = os.urandom(min(_BLOCK, left))
            f.write(block)
            left -= len(block)


def _drop_pages(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gigabytes", type=float, default=2.3)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bulkembed-digest-") as tmp:
        os.environ["BULKEMBED_CACHE_DIR"] = str(Path(tmp) / "cache")
        from bulkembed.models import file_digests
        from bulkembed.models.model_files import model_version

        folder = Path(tmp) / "model"
        folder.mkdir()
        size = int(args.gigabytes * 1e9)
        _write(folder / "model.safetensors", size)
        (folder / "config.json").write_text('{"model_type": "xlm-roberta"}')
        # A digest is remembered only for files that have not changed for a moment.
        time.sleep(file_digests.SETTLED_NS / 1e9 + 0.5)
        memo = Path(os.environ["BULKEMBED_CACHE_DIR"]) / file_digests.MEMO

        def timed(prepare: str) -> float:
            if prepare in ("cold", "read"):
                memo.unlink(missing_ok=True)
            if prepare == "cold":
                _drop_pages(folder / "model.safetensors")
            started = time.perf_counter()
            model_version(str(folder), None, folder / "config.json")
            return time.perf_counter() - started

        seconds: dict[str, list[float]] = {"cold": [], "read": [], "remembered": []}
        for _ in range(args.repeats):
            for kind in seconds:
                seconds[kind].append(timed(kind))
    medians = {kind: statistics.median(found) for kind, found in seconds.items()}
    print(
        json.dumps(
            {
                "cpu": _cpu(),
                "cores": os.cpu_count(),
                "gigabytes": args.gigabytes,
                "seconds": {k: [round(s, 4) for s in v] for k, v in seconds.items()},
                "median_seconds": {k: round(v, 4) for k, v in medians.items()},
                "gb_per_s": {k: round(args.gigabytes / medians[k], 2) for k in ("cold", "read")},
            }
        )
    )


if __name__ == "__main__":
    main()

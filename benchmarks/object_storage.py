"""Object storage against a local disk: the same run reading from and writing to S3.

Starts a real S3 server on 127.0.0.1 (moto, server mode: the one the tests use), uploads a
real-text corpus (`corpus.py`, Parquet files of 1,000-row row groups) to it, and runs the
CLI end to end four ways: local disk to local disk, S3 to local disk, local disk to S3 and
S3 to S3, in interleaved rounds. The model is host_ceiling.py's zero-layer BGE-M3 shape, so
that what is measured is the host side's reading and writing, not the model; two outputs:
`dense` (about 4 KB a document) and `dense,multivector` in float16 (about 2 KB a token).

moto keeps objects in memory and answers from one Python process: its rates are a floor
for what a real store does, not a forecast of one. The figure to read is the ratio to the
local run of the same round.

Prints one JSON object.

    python benchmarks/object_storage.py [--docs 2000 --copies 2] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from corpus import build, write
from host_ceiling import _cpu_name, build_model

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from s3_server import start_s3_server  # noqa: E402 (the tests' server, on the path above)

OUTPUTS = (("dense", "float32"), ("dense,multivector", "float16"))
WAYS = ("local->local", "s3->local", "local->s3", "s3->s3")


def _run(inputs: str, output: str, model: Path, outputs: str, dtype_out: str, env: dict) -> dict:
    """One CLI run in its own process, end to end; its wall seconds and summary."""
    command = [sys.executable, "-m", "bulkembed", "run", inputs, "--model", str(model)]
    command += ["--output", output, "--recipe", "bge-m3", "--devices", "cpu", "--quiet"]
    command += ["--dtype", "float32", "--outputs", outputs, "--dtype-out", dtype_out]
    command += ["--tokenize-workers", "1"]
    started = time.perf_counter()
    subprocess.run(command, check=True, env=env, capture_output=True)
    return {"wall_seconds": time.perf_counter() - started}


def _summary(output: str) -> dict:
    from bulkembed.storage import location

    return json.loads((location(output) / "_bulkembed" / "summary.json").read_text())


def _bytes_written(output: str) -> int:
    from bulkembed.storage import ObjectPath, location

    where = location(output)
    if isinstance(where, ObjectPath):
        listed = where.listing(recursive=True)
        return sum(p.stat().st_size for p, is_directory in listed if p.suffix == ".parquet")
    return sum(p.stat().st_size for p in Path(where).glob("*.parquet"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=2000)
    parser.add_argument("--copies", type=int, default=2, help="the corpus repeated, ids distinct")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved repeats")
    args = parser.parse_args()
    records = build(args.docs, args.copies)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        corpus = write(records, root / "corpus", files=4, fmt="parquet")
        model = root / "model"
        build_model(model, [r["text"] for r in records[: args.docs]])
        server = start_s3_server(root / "s3.log")
        try:
            env = {**os.environ, **server.environment, "HF_HUB_OFFLINE": "1"}
            os.environ.update(server.environment)
            client = server.client()
            client.create_bucket(Bucket="bench")
            for path in corpus:
                client.upload_file(str(path), "bench", f"corpus/{path.name}")
            sources = {"local": str(root / "corpus"), "s3": "s3://bench/corpus/"}
            results: dict[str, list[dict]] = {}
            for round_number in range(args.rounds):
                for outputs, dtype_out in OUTPUTS:
                    for way in WAYS:
                        source, target = way.split("->")
                        name = f"{outputs}-{dtype_out}-{way}-{round_number}"
                        output = (
                            f"s3://bench/out/{name}" if target == "s3" else str(root / "out" / name)
                        )
                        run = _run(sources[source], output, model, outputs, dtype_out, env)
                        summary = _summary(output)
                        run["tokens"] = summary["tokens"]
                        run["mb_written"] = _bytes_written(output) / 1e6
                        results.setdefault(f"{outputs} {dtype_out} {way}", []).append(run)
        finally:
            server.process.terminate()
            server.process.wait(timeout=10)
    table = []
    for key, runs in results.items():
        outputs, dtype_out, way = key.split(" ")
        local = results[f"{outputs} {dtype_out} local->local"]
        rates = [r["tokens"] / r["wall_seconds"] for r in runs]
        ratios = [
            (r["tokens"] / r["wall_seconds"]) / (base["tokens"] / base["wall_seconds"])
            for r, base in zip(runs, local, strict=True)
        ]
        table.append(
            {
                "outputs": outputs,
                "dtype_out": dtype_out,
                "way": way,
                "tokens_per_s": [round(r) for r in rates],
                "of_local": [round(r, 2) for r in ratios],
                "mb_written": round(runs[0]["mb_written"], 1),
                "mb_per_s": [round(r["mb_written"] / r["wall_seconds"], 1) for r in runs],
            }
        )
    print(
        json.dumps(
            {
                "cpu": _cpu_name(),
                "cores": os.cpu_count(),
                "docs": len(records),
                "tokens": results[f"dense float32 {WAYS[0]}"][0]["tokens"],
                "rounds": args.rounds,
                "runs": table,
            }
        )
    )


if __name__ == "__main__":
    main()

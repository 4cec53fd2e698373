"""The CPU embedders that `throughput.py` compares bulkembed with, each in a process of its own.

A peer is loaded once, then embeds the whole corpus each time it is asked, so that the
benchmark can interleave its repeats with the other configurations'. Its process may run
from another Python environment than the benchmark's (the ONNX Runtime and OpenVINO peers
need an older transformers than bulkembed's tests; `make bench` installs them into one of
their own). The process speaks JSON lines:

    python peers.py NAME MODEL_DIR TEXTS_JSON WORK
    -> {"load_seconds": ..., "export_seconds": ..., "versions": {...}}  (or {"error": ...})
    <- encode            -> {"seconds": ...}
    <- encode save       -> {"seconds": ...}, the vectors written to WORK/NAME.npy

The vectors are normalized float32; the seconds are the encode call's alone. Every peer
truncates at the model's maximum sequence length (`sentence_bert_config.json`), so that all
of them embed the same tokens.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np

ST_BATCH = 32
FASTEMBED_BATCH = 256
TORCH_PEERS = ("sentence_transformers_float32", "sentence_transformers_bf16_autocast")
ONNX_PEERS = (
    "sentence_transformers_onnx",
    "sentence_transformers_openvino",
    "fastembed_onnx",
    "infinity_optimum",
)
PEERS = TORCH_PEERS + ONNX_PEERS
# The peers that load an ONNX export made beforehand (the others export, or not, on load).
EXPORTED = ("fastembed_onnx", "infinity_optimum")
PACKAGES = (
    "torch",
    "transformers",
    "sentence-transformers",
    "onnxruntime",
    "openvino",
    "optimum-onnx",
    "optimum-intel",
    "fastembed",
    "infinity-emb",
    "numpy",
)
FASTEMBED_NAME = "bulkembed-bench/all-MiniLM-L6-v2"

Encode = Callable[[list[str]], np.ndarray]


def installed_versions() -> dict[str, str]:
    """Versions of the packages the peers run on, those this environment has."""
    found = {}
    for package in PACKAGES:
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            continue
    return found


def max_seq_length(model_dir: Path) -> int:
    """The truncation length sentence-transformers uses for this model."""
    config = json.loads((model_dir / "sentence_bert_config.json").read_text())
    return int(config["max_seq_length"])


def onnx_export(model_dir: Path, folder: Path) -> Path:
    """An ONNX export of the model's weights, with its tokenizer, in `folder`: `model.onnx`
    at the top (where FastEmbed and Infinity look for it). The tokenizer's
    `model_max_length` (FastEmbed's truncation) and the config's `max_position_embeddings`
    (Infinity's) are set to the model's maximum sequence length; the exported graph reads
    neither."""
    from optimum.onnxruntime import ORTModelForFeatureExtraction

    ORTModelForFeatureExtraction.from_pretrained(model_dir, export=True).save_pretrained(folder)
    limit = max_seq_length(model_dir)
    for name in ("tokenizer.json", "special_tokens_map.json", "vocab.txt"):
        shutil.copy(model_dir / name, folder / name)
    tokenizer = json.loads((model_dir / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(
        json.dumps({**tokenizer, "model_max_length": limit})
    )
    config = json.loads((model_dir / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": limit}))
    return folder


def _sentence_transformers(model_dir: Path, backend: str, autocast: bool) -> Encode:
    import torch
    from sentence_transformers import SentenceTransformer

    # OpenVINO computes in bfloat16 by default on a CPU with bfloat16 units; float32 here.
    options = {"ov_config": {"INFERENCE_PRECISION_HINT": "f32"}} if backend == "openvino" else {}
    # The ONNX and OpenVINO backends export the model on load; they take a str path only.
    model = SentenceTransformer(str(model_dir), device="cpu", backend=backend, model_kwargs=options)

    def encode(texts: list[str]) -> np.ndarray:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            return model.encode(texts, batch_size=ST_BATCH, normalize_embeddings=True)

    return encode


def _fastembed(folder: Path) -> Encode:
    from fastembed import TextEmbedding
    from fastembed.common.model_description import ModelSource, PoolingType

    TextEmbedding.add_custom_model(
        model=FASTEMBED_NAME,
        pooling=PoolingType.MEAN,
        normalization=True,
        sources=ModelSource(hf=FASTEMBED_NAME),
        dim=json.loads((folder / "config.json").read_text())["hidden_size"],
        model_file="model.onnx",
    )
    # Its cache (unused with a model path, created all the same) stays beside the export.
    cache = str(folder.parent / "fastembed-cache")
    model = TextEmbedding(FASTEMBED_NAME, cache_dir=cache, specific_model_path=str(folder))

    def encode(texts: list[str]) -> np.ndarray:
        return np.stack(list(model.embed(texts, batch_size=FASTEMBED_BATCH)))

    return encode


def _infinity(folder: Path, cleanup: ExitStack) -> Encode:
    import asyncio

    from infinity_emb import AsyncEmbeddingEngine, EngineArgs

    # Infinity names the ONNX file by the path it found it under, and optimum-onnx takes a
    # bare file name: a folder given as "." from inside it is the one way both agree.
    os.chdir(folder)
    # Its automatic pooling takes the CLS token for ONNX models; this model pools the mean.
    engine = AsyncEmbeddingEngine.from_args(
        EngineArgs(model_name_or_path=".", engine="optimum", device="cpu", pooling_method="mean")
    )
    loop = asyncio.new_event_loop()
    loop.run_until_complete(engine.astart())
    # Its batching threads keep the process alive until the engine stops.
    cleanup.callback(loop.run_until_complete, engine.astop())

    def encode(texts: list[str]) -> np.ndarray:
        vectors, _ = loop.run_until_complete(engine.embed(sentences=texts))
        return np.stack(vectors)

    return encode


def load(name: str, model_dir: Path, work: Path, cleanup: ExitStack) -> tuple[Encode, float, float]:
    """Peer `name` on the model in `model_dir`, ready to encode: the encode function, the
    seconds spent exporting the model for it beforehand, and the seconds to load it (for the
    sentence-transformers ONNX and OpenVINO backends, the export on load included). What
    must run to stop it goes on `cleanup`."""
    started = time.perf_counter()
    folder = onnx_export(model_dir, work / f"{name}-onnx") if name in EXPORTED else None
    exported = time.perf_counter()
    if name == "fastembed_onnx":
        encode = _fastembed(folder)
    elif name == "infinity_optimum":
        encode = _infinity(folder, cleanup)
    else:
        backend = {
            "sentence_transformers_onnx": "onnx",
            "sentence_transformers_openvino": "openvino",
        }
        autocast = name == "sentence_transformers_bf16_autocast"
        encode = _sentence_transformers(model_dir, backend.get(name, "torch"), autocast)
    return encode, exported - started, time.perf_counter() - exported


def serve(name: str, model_dir: Path, texts_file: Path, work: Path) -> None:
    """Load peer `name`, then answer encode requests on stdin until it closes."""
    # The answers keep stdout; whatever the libraries print goes to stderr.
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())

    def answer(message: dict) -> None:
        print(json.dumps(message), file=answers, flush=True)

    texts = json.loads(texts_file.read_text())
    with ExitStack() as cleanup:
        try:
            encode, export_seconds, load_seconds = load(name, model_dir, work, cleanup)
        except Exception as e:  # whatever stops a peer loading is its result, reported
            answer({"error": f"{type(e).__name__}: {e}".splitlines()[0]})
            return
        ready = {"load_seconds": round(load_seconds, 2), "export_seconds": round(export_seconds, 2)}
        answer({**ready, "versions": installed_versions()})
        for request in sys.stdin:
            started = time.perf_counter()
            vectors = encode(texts)
            seconds = time.perf_counter() - started
            if request.split() == ["encode", "save"]:
                np.save(work / f"{name}.npy", np.asarray(vectors, dtype=np.float32))
            answer({"seconds": seconds})


class PeerProcess:
    """A peer served by `python peers.py` from the environment of `python`; what it logs
    goes to WORK/NAME.log."""

    def __init__(self, name: str, python: str, model_dir: Path, texts_file: Path, work: Path):
        self.name = name
        self.vectors_file = work / f"{name}.npy"
        environment = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(work / "hub")}
        command = [python, str(Path(__file__).resolve()), name, str(model_dir), str(texts_file)]
        with open(work / f"{name}.log", "w") as log:
            self.process = subprocess.Popen(
                [*command, str(work)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env=environment,
                cwd=work,
            )

    def _answer(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            return {"error": f"the process exited with {self.process.wait()}"}
        return json.loads(line)

    def ready(self) -> dict:
        """The load report: seconds and versions, or an error."""
        return self._answer()

    def encode(self, save: bool) -> float:
        """Seconds the peer took to embed the corpus once (and the vectors saved, if asked)."""
        self.process.stdin.write("encode save\n" if save else "encode\n")
        self.process.stdin.flush()
        answer = self._answer()
        if "error" in answer:
            raise RuntimeError(f"{self.name}: {answer['error']}")
        return answer["seconds"]

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()


if __name__ == "__main__":
    name, model_dir, texts_file, work = sys.argv[1:]
    serve(name, Path(model_dir), Path(texts_file), Path(work))

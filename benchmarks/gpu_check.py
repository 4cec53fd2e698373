"""The GPU path checked in a few minutes on one GPU, offline: `make gpu-check`.

It builds random-weight models of real shapes (`check_models`: BGE-M3's, an XLM-RoBERTa
large, and all-MiniLM-L6-v2's), with tokenizers trained on the bundled sample, and runs eight
checks, each with a pass criterion:

1. stream: 40 flat batches of 16,384 tokens through `Encoder.embed_stream` under
   `torch.cuda.set_sync_debug_mode("warn")`: no synchronizing call, the compute stream
   busy (CUDA events around each batch) for at least 0.9 of the stream's wall time, and
   vectors equal to the same batches embedded one by one; tokens/s and MFU; and the
   tokens/s with each switch of the GPU path on and off (reported, not judged):
   `BULKEMBED_COPY_BACK` side or compute, each attention kernel that runs on the GPU
   (`BULKEMBED_ATTENTION_KERNEL`), the same batches padded (`--attention padded`, two
   passes: the first meets each bucketed shape anew, the second knows them), and
   batches of 65,536 tokens (as large as a flat budget on CUDA goes,
   `BULKEMBED_FLAT_BUDGET`) against 16,384;
2. varlen: a batch mixing a document past 2,000 tokens with typical, 2- and 1-token ones,
   flat (the varlen kernel) against padded: dense, sparse and multi-vector outputs agree;
3. attention: each attention implementation (`attention_kernels`) on the sample's documents
   cut into batches as a window cuts them, each batch twice (a new shape, then a known
   one): seconds, TFLOP/s of attention and of one layer's matrix multiplies, and the
   error of each against a float32 reference; the kernel a run chooses (`kernel_choice`,
   its timings reported) must agree;
4. devices: `bulkembed run --devices cuda:0,cuda:0` against `--devices cuda:0`, `--dtype
   auto`: the same ids and vectors; the dtype the run kept, GPU memory per process (NVML);
5. memory: `--max-batch-tokens auto` at the model's real size, then an out-of-memory under
   a reduced memory fraction: the batch is halved, the limit remembered, and the next batch
   as large is halved before it runs;
6. compile: the flat model compiled (`--compile`) against eager: vectors, graph breaks,
   recompiles, seconds to compile;
7. families: every flat family (ModernBERT, NomicBERT, the decoders with their windows and
   grouped-query heads; `flat_families`) against transformers' padded model at BERT-base
   size, and its tokens/s over the BERT family's;
8. startup: each start-up step of the BGE-M3-shaped model (`startup`: imports, weights onto
   the device, flat module, kernel choice and budget probe measured then replayed, first
   batch) and the start-up of two runs, the second replaying what the first recorded
   (the target on a GPU is 8 s or less; reported, not judged).

Prints one table and, with `--json FILE`, writes `{"checks": [{"name", "result",
"figures"}], ...}`. Exits 1 when a check fails. `--smoke` runs every check on the CPU with
tiny shapes, float32 and the reference attention standing in for the kernel (criteria on
speed are reported, not judged): so that CI runs this script's code.

    HF_HUB_OFFLINE=1 python benchmarks/gpu_check.py [--json gpu-check.json] [--smoke]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from check_models import bge_m3_shaped, minilm_shaped, sample_texts

# Pass criteria.
BUSY_FRACTION = 0.9
HALF_COSINE = 0.999
FLOAT32_COSINE = 0.99999
# ‖out − ref‖ / ‖ref‖ of attention against a float32 reference: bf16 operands land near 4e-3.
ATTENTION_ERROR = 2e-2
FLOAT32_ATTENTION_ERROR = 1e-5


@dataclass(slots=True)
class Check:
    """One check's outcome: `result` is pass or fail; `figures` what it measured."""

    name: str
    result: str
    figures: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Setting:
    """Where the checks run and at what size."""

    smoke: bool
    device: str
    dtype: Any
    folder: Path
    batches: int
    batch_tokens: int
    long_document: int

    @property
    def cosine(self) -> float:
        """How close two ways of computing the same vectors must be in this dtype."""
        return FLOAT32_COSINE if str(self.dtype) == "torch.float32" else HALF_COSINE


def _spec(model: Path, recipe: str, **options: Any) -> Any:
    from bulkembed.config import RunConfig
    from bulkembed.models.model_spec import resolve_model

    return resolve_model(
        RunConfig(inputs=("-",), output="-", model=str(model), recipe=recipe, **options)
    )


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return (a * b).sum(axis=1) / np.maximum(norms, 1e-30)


def _documents(spec: Any) -> list[np.ndarray]:
    """The token ids of each document of the sample, as `spec` tokenizes them."""
    from bulkembed.batching.tokenize import TextTokenizer, TokenizerSettings

    settings = TokenizerSettings(spec.tokenizer_json, spec.max_length, spec.prompt)
    ids, lengths, _ = TextTokenizer(settings)(sample_texts())
    return np.split(ids, np.cumsum(lengths)[:-1])


def _batches(setting: Setting, spec: Any, count: int) -> list[Any]:
    """`count` batches of about `setting.batch_tokens` tokens of the sample, lengths
    sorted as a window packs them."""
    from bulkembed.contracts import TokenBatch

    documents = _documents(spec)
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(count):
        chosen, tokens = [], 0
        while tokens < setting.batch_tokens:
            document = documents[int(rng.integers(len(documents)))]
            chosen.append(document)
            tokens += len(document)
        chosen.sort(key=len, reverse=True)
        batches.append(TokenBatch.from_sequences(chosen))
    return batches


def _synchronize(setting: Setting) -> None:
    import torch

    if not setting.smoke:
        torch.cuda.synchronize()


def _mfu(setting: Setting, model: Path, batches: list[Any], seconds: float) -> float | None:
    """The batches' forward FLOPs per second over the device's dense peak (None on a CPU,
    or for a device whose peak is not known)."""
    from gpu import forward_flops, matmul_weights, peak_tflops
    from transformers import AutoConfig, AutoModel

    if setting.smoke:
        return None
    import torch

    peak, _ = peak_tflops(torch.cuda.get_device_name(setting.device), None)
    if peak is None:
        return None
    config = AutoConfig.from_pretrained(model)
    with torch.device("meta"):
        weights = matmul_weights(AutoModel.from_config(config))
    lengths = [int(n) for b in batches for n in b.lengths]
    flops = forward_flops(lengths, weights, config.hidden_size, config.num_hidden_layers)
    return round(flops / seconds / (peak * 1e12), 3)


@contextlib.contextmanager
def _syncs_counted(setting: Setting) -> Iterator[list[str]]:
    """The synchronizing CUDA calls made in the block (`set_sync_debug_mode("warn")`)."""
    import torch

    found: list[str] = []
    if setting.smoke:
        yield found
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield found
        finally:
            torch.cuda.set_sync_debug_mode("default")
    # Switching the mode on warns once that it is a prototype: that is no call of the block.
    messages = [str(w.message) for w in caught if "prototype feature" not in str(w.message)]
    found += [m.splitlines()[0] for m in messages if "synchroniz" in m]


def _busy_timed(encoder: Any, setting: Setting) -> list[Callable[[], float]]:
    """Wrap `encoder.launch` to time each batch's work on the compute stream (CUDA events
    around what it enqueues); the list of each batch's milliseconds, read once done."""
    import torch

    times: list[Callable[[], float]] = []
    launch = encoder.launch

    def timed(inputs: Any) -> Any:
        if setting.smoke:
            started = time.perf_counter()
            landing = launch(inputs)
            seconds = time.perf_counter() - started
            times.append(lambda: seconds * 1000)
            return landing
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        landing = launch(inputs)
        end.record()
        times.append(lambda: start.elapsed_time(end))
        return landing

    encoder.launch = timed
    return times


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """The process's environment with `values` set, as it was after."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _stream_rate(
    setting: Setting, spec: Any, batches: list[Any], switches: dict[str, str], passes: int = 1
) -> Any:
    """Tokens/s of `batches` through the stream of an encoder started with `switches` in
    the environment, after one warm-up batch; with `passes` > 1, the rate of each pass."""
    from bulkembed.encoders import start_encoder

    tokens = sum(int(b.lengths.sum()) for b in batches)
    rates = []
    with _environment(switches):
        encoder, _ = start_encoder(spec, setting.device, setting.dtype, None)
        list(encoder.embed_stream([(-1, batches[0])], lambda *_: None))
        for _ in range(passes):
            _synchronize(setting)
            started = time.perf_counter()
            for _ in encoder.embed_stream(enumerate(batches), lambda *_: None):
                continue
            _synchronize(setting)
            rates.append(round(tokens / (time.perf_counter() - started), 1))
    return rates[0] if passes == 1 else rates


def _switch_rates(setting: Setting, spec: Any, batches: list[Any]) -> dict[str, Any]:
    """Tokens/s of the stream with each switch of the GPU path one way and the other."""
    from bulkembed.encoders import kernels
    from bulkembed.encoders.kernel_choice import KERNEL_VARIABLE
    from bulkembed.encoders.transfer import COPY_BACK_VARIABLE

    rates: dict[str, Any] = {}
    for way in ("side", "compute"):
        rate = _stream_rate(setting, spec, batches, {COPY_BACK_VARIABLE: way})
        rates[f"copy_back_{way}"] = rate
    # Each kernel that runs here, asked for by name.
    for name in kernels.available(setting.device, setting.dtype):
        rate = _stream_rate(setting, spec, batches, {KERNEL_VARIABLE: name})
        rates[f"kernel_{name}"] = rate
    # The same batches padded: the padding, and the attention mask it takes, cost this much;
    # the first pass meets each bucketed shape for the first time, the second knows them.
    padded = _stream_rate(setting, replace(spec, attention="padded"), batches, {}, passes=2)
    rates["padded_layout_first_pass"], rates["padded_layout_second_pass"] = padded
    # The stream's own batches against a quarter as many four times as large, in the
    # default ways.
    tokens = setting.batch_tokens * 4
    wide = _batches(replace(setting, batch_tokens=tokens), spec, max(1, len(batches) // 4))
    rates[f"batches_of_{tokens}_tokens"] = _stream_rate(setting, spec, wide, {})
    return rates


def check_stream(setting: Setting) -> Check:
    """Check 1: the pipelined stream (see the module's docstring)."""
    from bulkembed.encoders import start_encoder

    model = setting.folder / "bge-m3"
    spec = _spec(model, "bge-m3", attention="flat", outputs=("dense", "sparse"))
    encoder, _ = start_encoder(spec, setting.device, setting.dtype, None)
    batches = _batches(setting, spec, setting.batches)
    list(encoder.embed_stream([(-1, batches[0])], lambda *_: None))  # warm-up
    expected = [encoder.embed_batch(b) for b in batches]
    times = _busy_timed(encoder, setting)
    _synchronize(setting)
    started = time.perf_counter()
    with _syncs_counted(setting) as syncs:
        found = [e for _, e in encoder.embed_stream(enumerate(batches), lambda *_: None)]
    _synchronize(setting)
    seconds = time.perf_counter() - started
    busy = sum(t() for t in times) / 1000 / seconds
    tokens = sum(int(b.lengths.sum()) for b in batches)
    largest = max(
        float(np.abs(f.dense - e.dense).max()) for f, e in zip(found, expected, strict=True)
    )
    figures = {
        "batches": len(batches),
        "tokens": tokens,
        "tokens_per_s": round(tokens / seconds, 1),
        "mfu": _mfu(setting, model, batches, seconds),
        "busy_fraction": round(busy, 3),
        "synchronizing_calls": len(syncs),
        "first_synchronizing_call": syncs[0] if syncs else None,
        "largest_difference_to_one_by_one": largest,
        "attention": "flat" if encoder.unpadded else "padded",
        "switches": _switch_rates(setting, spec, batches),
    }
    passed = largest == 0.0 and not syncs and (setting.smoke or busy >= BUSY_FRACTION)
    return Check("stream", "pass" if passed else "fail", figures)


def _mixed_batch(setting: Setting, spec: Any) -> Any:
    """A long document, typical ones, and documents of 2 and 1 tokens, sorted."""
    from bulkembed.contracts import TokenBatch

    rng = np.random.default_rng(1)
    lengths = [setting.long_document, 300, 180, 120, 2, 1]
    if setting.smoke:
        lengths = [setting.long_document, 20, 12, 2, 1]
    vocabulary = int(spec.pad_token_id) + 5, 400 if setting.smoke else 8000
    return TokenBatch.from_sequences(
        [rng.integers(*vocabulary, size=n).astype(np.int32) for n in lengths]
    )


def check_varlen(setting: Setting) -> Check:
    """Check 2: flat against padded batches at real shapes."""
    from bulkembed.encoders import build_encoder

    model = setting.folder / "bge-m3"
    outputs = ("dense", "sparse", "multivector")
    found = {}
    for attention in ("padded", "flat"):
        spec = _spec(model, "bge-m3", attention=attention, outputs=outputs)
        encoder = build_encoder(spec, setting.device, setting.dtype)
        found[attention] = encoder.embed_batch(_mixed_batch(setting, spec))
        found[f"{attention}-ran"] = "flat" if encoder.unpadded else "padded"
        found[f"{attention}-kernel"] = encoder.attention_kernel
    padded, flat = found["padded"], found["flat"]
    dense = float(_cosines(flat.dense, padded.dense).min())
    tokens = np.concatenate(
        [_cosines(a, b) for a, b in zip(flat.multivector, padded.multivector, strict=True)]
    )
    same_keys = np.mean(
        [
            set(a.indices.tolist()) == set(b.indices.tolist())
            for a, b in zip(flat.sparse, padded.sparse, strict=True)
        ]
    )
    figures = {
        "kernel": found["flat-kernel"],
        "lengths": _mixed_batch(setting, spec).lengths.tolist(),
        "layouts_ran": [found["padded-ran"], found["flat-ran"]],
        "dense_lowest_cosine": round(dense, 7),
        "multivector_cosine_1st_percentile": round(float(np.percentile(tokens, 1)), 7),
        "sparse_same_keys_share": round(float(same_keys), 3),
    }
    passed = (
        found["flat-ran"] == "flat"
        and dense >= setting.cosine
        and figures["multivector_cosine_1st_percentile"] >= setting.cosine
    )
    return Check("varlen", "pass" if passed else "fail", figures)


def check_attention(setting: Setting) -> Check:
    """Check 3: each attention kernel on the sample's documents cut as a window cuts them
    (`attention_kernels`); passes when the kernel the flat path runs agrees with the
    reference."""
    from attention_kernels import measure
    from transformers import AutoConfig

    from bulkembed.encoders.kernel_choice import AttentionShape, choose_kernel
    from bulkembed.encoders.kernels import FULL

    model = setting.folder / "bge-m3"
    config = AutoConfig.from_pretrained(model)
    spec = _spec(model, "bge-m3")
    lengths = np.array([len(d) for d in _documents(spec)])
    width, inner = config.hidden_size, config.intermediate_size
    heads = config.num_attention_heads
    shapes = [(width, 3 * width), (width, width), (width, inner), (inner, width)]
    figures = measure(
        lengths, heads, width // heads, setting.batch_tokens, setting.device, setting.dtype, shapes
    )
    # The kernel a run of this model takes here, and the check's timing of each.
    shape = AttentionShape(heads, heads, width // heads, ((False, FULL),), spec.max_length)
    choice = choose_kernel(setting.device, setting.dtype, shape)
    used = choice.name
    figures["choice"] = choice.describe()
    tolerance = ATTENTION_ERROR if setting.cosine == HALF_COSINE else FLOAT32_ATTENTION_ERROR
    figures["flat_path_runs"] = used
    passed = figures[used]["runs"] and figures[used]["error"] <= tolerance
    return Check("attention", "pass" if passed else "fail", figures)


@contextlib.contextmanager
def _gpu_memory_per_process(setting: Setting) -> Iterator[dict[int, int]]:
    """The most GPU memory (MB) each process held while the block ran, sampled by NVML
    every 0.2 s; empty on a CPU or without `pynvml`."""
    from importlib.util import find_spec

    from gpu import nvml_sampling

    peaks: dict[int, int] = {}
    if setting.smoke or find_spec("pynvml") is None:
        yield peaks
        return
    index = int(setting.device.partition(":")[2] or 0)

    def sample(nvml: Any) -> None:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        for process in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
            used = (process.usedGpuMemory or 0) // 2**20
            peaks[process.pid] = max(peaks.get(process.pid, 0), used)

    with nvml_sampling(sample, 0.2):
        yield peaks


def check_devices(setting: Setting) -> Check:
    """Check 4: two device processes on one device against one process, `--dtype auto`."""
    import pyarrow.parquet as pq

    from bulkembed import embed_corpus
    from bulkembed.config import RunConfig

    texts = sample_texts()[: 400 if setting.smoke else 2000]
    corpus = setting.folder / "corpus.jsonl"
    corpus.write_text(
        "".join(json.dumps({"id": str(i), "text": t}) + "\n" for i, t in enumerate(texts))
    )
    model = setting.folder / "minilm"
    tables, figures = {}, {}
    for name, devices in (("one", setting.device), ("two", f"{setting.device},{setting.device}")):
        config = RunConfig(
            inputs=(str(corpus),),
            output=str(setting.folder / f"out-{name}"),
            model=str(model),
            recipe="all-minilm-l6-v2",
            devices=devices,
            dtype="auto",
            records_per_unit=100,
            overwrite=True,
            tokenize_workers=1,
        )
        with _gpu_memory_per_process(setting) as peaks:
            summary = embed_corpus(config)
        table = pq.read_table(setting.folder / f"out-{name}").sort_by("id")
        tables[name] = table
        figures[f"{name}_process"] = {
            "dtype": summary.run["dtype"],
            "dtype_check": summary.run["dtype_check"],
            "gpu_memory_mb_per_process": sorted(peaks.values()) or None,
            "docs_per_s": summary.docs_per_s,
        }
    one, two = tables["one"], tables["two"]
    same_ids = one["id"].to_pylist() == two["id"].to_pylist()
    lowest = float(
        _cosines(np.array(one["dense"].to_pylist()), np.array(two["dense"].to_pylist())).min()
    )
    figures |= {"same_ids": same_ids, "docs": one.num_rows, "lowest_cosine": round(lowest, 7)}
    same_dtype = figures["one_process"]["dtype"] == figures["two_process"]["dtype"]
    passed = same_ids and same_dtype and lowest >= HALF_COSINE
    return Check("devices", "pass" if passed else "fail", figures)


class _SimulatedMemory:
    """On a CPU, what a GPU of `tokens` tokens of memory would do: batches that cost more
    run out of memory (CUDA's error), as the real one does under a memory fraction."""

    def __init__(self, encoder: Any, tokens: int) -> None:
        import torch

        launch = encoder.launch

        def limited(inputs: Any) -> Any:
            if encoder.cost(inputs.batch) > tokens:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated).")
            return launch(inputs)

        encoder.launch = limited


def check_memory(setting: Setting) -> Check:
    """Check 5: the tuned budget, then a real out-of-memory, halved and remembered."""
    import torch

    from bulkembed.encoders import start_encoder

    model = setting.folder / "bge-m3"
    # Documents of the model's length, but for the smoke check: its memory is a few batches.
    length = {"max_length": 64} if setting.smoke else {}
    spec = _spec(
        model, "bge-m3", attention="padded", outputs=("dense",), max_batch_tokens="auto", **length
    )
    encoder, budget = start_encoder(spec, setting.device, setting.dtype, None)
    big = _batches(replace(setting, batch_tokens=setting.batch_tokens * 4), spec, 1)[0]
    if setting.smoke:
        _SimulatedMemory(encoder, setting.batch_tokens)
    calls: list[int] = []
    launch = encoder.launch

    def counted(inputs: Any) -> Any:
        calls.append(len(inputs.batch))
        return launch(inputs)

    encoder.launch = counted
    if not setting.smoke:
        # Room for the weights and 1 GiB: a batch of 65,536 tokens must be halved.
        torch.cuda.empty_cache()
        weights = torch.cuda.memory_allocated(setting.device)
        total = torch.cuda.get_device_properties(setting.device).total_memory
        torch.cuda.set_per_process_memory_fraction((weights + 2**30) / total, setting.device)
    try:
        first = encoder.embed_within_memory(big)
        first_calls, calls[:] = list(calls), []
        second = encoder.embed_within_memory(big)
    finally:
        if not setting.smoke:
            torch.cuda.set_per_process_memory_fraction(1.0, setting.device)
    figures = {
        "tuned_budget": budget,
        "batch_documents": len(big),
        "batch_cost": encoder.cost(big),
        "remembered_limit": encoder.memory_limit,
        "first_calls": first_calls,
        "second_calls": calls,
    }
    halved = len(first_calls) > 1 and first_calls[0] == len(big)
    remembered = encoder.memory_limit is not None and calls and calls[0] < len(big)
    same = bool(np.allclose(first.dense, second.dense, atol=1e-6))
    passed = halved and remembered and same and (setting.smoke or bool(budget))
    return Check("memory", "pass" if passed else "fail", figures)


def check_compile(setting: Setting) -> Check:
    """Check 6: the flat model compiled against eager."""
    import torch._dynamo

    from bulkembed.encoders import build_encoder

    model = setting.folder / "bge-m3"
    batches = _batches(setting, _spec(model, "bge-m3"), 4)
    found = {}
    for compile_model in (False, True):
        spec = _spec(model, "bge-m3", attention="flat", outputs=("dense",), compile=compile_model)
        encoder = build_encoder(spec, setting.device, setting.dtype)
        torch._dynamo.utils.counters.clear()
        started = time.perf_counter()
        first = encoder.embed_batch(batches[0])
        first_seconds = time.perf_counter() - started
        started = time.perf_counter()
        rest = [encoder.embed_batch(b) for b in batches[1:]]
        steady = (time.perf_counter() - started) / max(1, len(rest))
        found[compile_model] = [first, *rest]
        if compile_model:
            counters = torch._dynamo.utils.counters
            breaks = sum(counters["graph_break"].values())
            recompiles = int(counters["stats"].get("unique_graphs", 0))
            compile_seconds = round(first_seconds - steady, 2)
    lowest = min(
        float(_cosines(c.dense, e.dense).min())
        for c, e in zip(found[True], found[False], strict=True)
    )
    figures = {
        "graph_breaks": breaks,
        "graphs": recompiles,
        "compile_seconds": compile_seconds,
        "lowest_cosine_to_eager": round(lowest, 7),
    }
    passed = breaks == 0 and lowest >= setting.cosine
    return Check("compile", "pass" if passed else "fail", figures)


def check_families(setting: Setting) -> Check:
    """Check 7: every flat family against transformers' padded model, and its tokens/s over
    the BERT family's at the same size (`flat_families`)."""
    from flat_families import measure

    from bulkembed.encoders import kernels

    size = "smoke" if setting.smoke else "full"
    found = measure(size, setting.device, setting.dtype, setting.batch_tokens)
    passed = all(f["runs_flat"] and f["lowest_cosine"] >= setting.cosine for f in found.values())
    figures = {"kernel": kernels.preferred(setting.device, setting.dtype), **found}
    return Check("families", "pass" if passed else "fail", figures)


def check_startup(setting: Setting) -> Check:
    """Check 8: each start-up step of the BGE-M3-shaped model, and two runs' start-up, the
    second after the first recorded its decisions (`startup`)."""
    from startup import measure

    texts = sample_texts()[:200]
    corpus = setting.folder / "startup.jsonl"
    corpus.write_text(
        "".join(json.dumps({"id": str(i), "text": t}) + "\n" for i, t in enumerate(texts))
    )
    model = setting.folder / "bge-m3"
    found = measure(model, "bge-m3", setting.device, setting.dtype, corpus)
    passed = found["run_first_startup_s"] is not None and found["run_second_startup_s"] is not None
    return Check("startup", "pass" if passed else "fail", found)


CHECKS = (
    check_stream,
    check_varlen,
    check_attention,
    check_devices,
    check_memory,
    check_compile,
    check_families,
    check_startup,
)


def _setting(smoke: bool, folder: Path) -> Setting:
    import torch

    if smoke:
        return Setting(True, "cpu", torch.float32, folder, 3, 256, 120)
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --smoke for the CPU check of this script")
    from bulkembed.models.devices import cuda_supports_bfloat16

    dtype = torch.bfloat16 if cuda_supports_bfloat16("cuda:0") else torch.float16
    return Setting(False, "cuda:0", dtype, folder, 40, 16384, 2100)


def _table(checks: list[Check]) -> str:
    lines = [f"{'check':<10} {'result':<7} figures"]
    for check in checks:
        shown = ", ".join(f"{k} {v}" for k, v in check.figures.items() if not isinstance(v, dict))
        lines.append(f"{check.name:<10} {check.result:<7} {shown}")
        for key, value in check.figures.items():
            if isinstance(value, dict):
                lines.append(f"{'':<18} {key}: {json.dumps(value)}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the checks here as JSON")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU")
    args = parser.parse_args()
    import torch

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bulkembed-gpu-check-") as tmp:
        setting = _setting(args.smoke, Path(tmp))
        bge_m3_shaped(setting.folder / "bge-m3", tiny=args.smoke)
        (setting.folder / "minilm").symlink_to(minilm_shaped(setting.folder / "st", args.smoke))
        checks = []
        for check in CHECKS:
            try:
                checks.append(check(setting))
            except Exception as e:  # a check that crashes is a failed check, the others go on
                checks.append(
                    Check(check.__name__.removeprefix("check_"), "fail", {"error": repr(e)})
                )
            # Each check as it ends, so that a run cut short still tells what it saw.
            print(_table(checks[-1:]).split("\n", 1)[1], file=sys.stderr, flush=True)
    device = "cpu (smoke)" if args.smoke else torch.cuda.get_device_name(0)
    results = {
        "device": device,
        "dtype": str(setting.dtype).removeprefix("torch."),
        "torch": torch.__version__,
        "seconds": round(time.perf_counter() - started, 1),
        "checks": [{"name": c.name, "result": c.result, "figures": c.figures} for c in checks],
    }
    print(f"bulkembed GPU check on {device}, {results['dtype']}, {results['seconds']} s")
    print(_table(checks))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    sys.exit(0 if all(c.result == "pass" for c in checks) else 1)


if __name__ == "__main__":
    main()

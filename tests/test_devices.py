import json
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pytest
import torch
from helpers import cosines, embed_texts, sample_texts, write_jsonl
from typer.testing import CliRunner

from bulkembed.batching.tokenize import TextTokenizer, TokenizerSettings
from bulkembed.cli import app
from bulkembed.config import DEFAULT_MAX_BATCH_TOKENS, DType, RunConfig
from bulkembed.encoders import TokenBatch, build_encoder
from bulkembed.encoders.backend import attention_implementation
from bulkembed.encoders.runtime import budget_for_memory, recorded_budget
from bulkembed.errors import BulkembedError
from bulkembed.models.devices import (
    cpu_threads_per_worker,
    resolve_device,
    resolve_devices,
    resolve_dtype,
)
from bulkembed.models.model_spec import resolve_model
from bulkembed.sources import Chunk

CUDA = torch.cuda.is_available()


def test_cpu_and_auto_without_cuda():
    assert resolve_device("cpu") == "cpu"
    assert resolve_devices("auto") == (
        [f"cuda:{i}" for i in range(torch.cuda.device_count())] if CUDA else ["cpu"]
    )
    assert resolve_devices("cpu, cpu") == ["cpu", "cpu"]


def test_cpu_workers_share_the_cores(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    assert cpu_threads_per_worker(["cpu"]) == 16
    assert cpu_threads_per_worker(["cpu", "cpu", "cpu"]) == 5
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert cpu_threads_per_worker(["cpu", "cpu", "cpu"]) == 1


@pytest.mark.parametrize(
    ("devices", "message"),
    [
        (",", "name at least one device"),
        ("cpu,tpu", "expected auto, cpu or cuda:N"),
        ("tpu", "expected auto, cpu or cuda:N"),
        ("cuda:x", "expected cuda:N with N a number"),
        ("cuda:99", "this machine has"),
    ],
)
def test_device_errors(devices, message):
    with pytest.raises(BulkembedError, match=message):
        resolve_devices(devices)


def test_auto_dtype_is_bfloat16_on_cpus_that_accelerate_it(monkeypatch):
    from bulkembed.models import devices

    monkeypatch.setattr(devices, "cpu_accelerates_bfloat16", lambda: False)
    assert resolve_dtype(DType.AUTO, "cpu") is torch.float32
    monkeypatch.setattr(devices, "cpu_accelerates_bfloat16", lambda: True)
    assert resolve_dtype(DType.AUTO, "cpu") is torch.bfloat16
    assert resolve_dtype(DType.FLOAT32, "cpu") is torch.float32
    assert resolve_dtype(DType.BFLOAT16, "cpu") is torch.bfloat16


def test_auto_dtype_on_cuda_is_bfloat16_from_compute_capability_8_and_float16_before(
    monkeypatch,
):
    capability = {"value": (8, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: capability["value"])
    assert resolve_dtype(DType.AUTO, "cuda:0") is torch.bfloat16
    capability["value"] = (9, 0)
    assert resolve_dtype(DType.AUTO, "cuda:1") is torch.bfloat16
    capability["value"] = (7, 5)
    assert resolve_dtype(DType.AUTO, "cuda:0") is torch.float16
    assert resolve_dtype(DType.FLOAT32, "cuda:0") is torch.float32


def test_the_reference_of_the_dtype_check_runs_without_tf32(tiny_st, monkeypatch):
    from bulkembed.batching.tokenize import TokenizedChunk
    from bulkembed.config import RunConfig
    from bulkembed.encoders import build_encoder
    from bulkembed.engine import precision
    from bulkembed.models.model_spec import resolve_model

    spec = resolve_model(RunConfig(inputs=("x",), output="o", model=str(tiny_st("mean"))))
    reference = build_encoder(spec, "cpu", torch.float32)
    seen = []
    embed_sample = precision.embed_sample

    def recording(encoder, sequences, budget):
        seen.append((str(encoder.dtype), torch.get_float32_matmul_precision()))
        return embed_sample(encoder, sequences, budget)

    monkeypatch.setattr(precision, "embed_sample", recording)
    chunk = Chunk(0, 0, pa.array(["a", "b"]), pa.array(["x", "y"]), True)
    tokens, lengths = np.arange(1, 7, dtype=np.int32), np.array([3, 3])
    tokenized = TokenizedChunk(chunk, tokens, lengths, np.zeros(2, bool))
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")  # as a float32 run on CUDA sets it
        checked = precision.check_on_window(reference, [tokenized], torch.bfloat16, 512)
        assert checked is not None
        assert seen == [("torch.float32", "highest"), ("torch.bfloat16", "high")]
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(before)


def test_device_seconds_of_the_float32_start_stay_counted_when_the_check_keeps_half(
    tiny_st, monkeypatch
):
    from bulkembed.batching.tokenize import TokenizedChunk
    from bulkembed.engine import precision
    from bulkembed.engine.session import Unsettled, start_session
    from bulkembed.models import devices
    from bulkembed.reporting.progress import QuietReporter

    monkeypatch.setattr(devices, "cpu_accelerates_bfloat16", lambda: True)
    monkeypatch.setattr(precision, "PARITY_THRESHOLD", 0.9)
    spec = resolve_model(RunConfig(inputs=("x",), output="o", model=str(tiny_st("mean"))))
    unsettled = start_session(spec, ["cpu"], DType.AUTO, None, QuietReporter())
    assert isinstance(unsettled, Unsettled)
    start = unsettled.embedder
    # What CUDA events timed on the float32 start: a `--max-batch-tokens auto` probe.
    start.counts.busy_seconds = 5.0
    before = unsettled.counts
    chunk = Chunk(0, 0, pa.array(["a", "b"]), pa.array(["x", "y"]), True)
    tokens, lengths = np.arange(1, 7, dtype=np.int32), np.array([3, 3])
    settled = unsettled.settle([TokenizedChunk(chunk, tokens, lengths, np.zeros(2, bool))])
    assert settled is not None
    session = settled.session
    assert session.dtype == "bfloat16" and session.embedder is not start
    # The float32 start is let go: its model is gone, not kept beside the one in bfloat16.
    assert start.model is None and session.embedder.model is not None
    # The run's counts only grow: the summary's busy fraction is never below 0.
    assert session.counts.busy_seconds == 5.0
    assert session.counts.since(before).busy_seconds == 0.0


def test_float32_on_cuda_uses_tensor_cores():
    from bulkembed.models.devices import allow_tensor_cores

    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        allow_tensor_cores("cpu", torch.float32)
        allow_tensor_cores("cuda:0", torch.float16)
        assert torch.get_float32_matmul_precision() == "highest"
        allow_tensor_cores("cuda:0", torch.float32)
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(before)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_half_precision_matches_cpu_float32(tiny_st, dtype):
    spec = resolve_model(RunConfig(inputs=("x",), output="o", model=str(tiny_st("mean"))))
    flat, lengths, _ = TextTokenizer(TokenizerSettings(spec.tokenizer_json, spec.max_length))(
        sample_texts(64)
    )
    batch = TokenBatch(flat, lengths)
    cpu = build_encoder(spec, "cpu", torch.float32).embed_batch(batch).dense
    gpu = build_encoder(spec, "cuda:0", dtype).embed_batch(batch).dense
    assert gpu.dtype == np.float32
    assert (cpu * gpu).sum(axis=1).min() >= 0.999


def test_a_run_turns_off_the_onednn_primitive_cache(tmp_path, tiny_st, monkeypatch):
    import os

    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": "memory stays flat"}])
    args = ["run", str(corpus), "--model", str(tiny_st("mean")), "--output", str(tmp_path / "o")]
    assert CliRunner().invoke(app, [*args, "--quiet", "--tokenize-workers", "0"]).exit_code == 0
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "0"


def test_budget_for_memory_fill_a_share_of_free_memory_in_whole_documents():
    # 10 GiB free at 100 kB a token: 70% is 75,161 tokens, 146 documents of 512.
    assert budget_for_memory(10 * 2**30, 200_000, 512) == 73 * 512
    assert budget_for_memory(2**20, 100_000, 512) == 512  # one document at least
    assert budget_for_memory(2**40, 1.0, 512) == 2**16  # capped where GEMMs are saturated


def test_the_budget_probe_is_a_padded_batch_at_the_maximum_length(tiny_st):
    spec = resolve_model(RunConfig(inputs=("x",), output="o", model=str(tiny_st("mean"))))
    probe = build_encoder(spec, "cpu", torch.float32).probe_batch()
    longest = spec.max_length
    assert probe.lengths.tolist() == [longest] * (8192 // longest - 1) + [longest - 1]
    assert probe.padded_tokens == 8192


def test_the_memory_a_token_takes_is_probed_once_then_replayed_at_the_memory_free_now(
    tmp_path, tiny_st, monkeypatch
):
    from bulkembed.encoders import decisions

    monkeypatch.setenv("BULKEMBED_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(decisions, "device_identity", lambda device: "a GPU sm_90")
    memory = {"free": 10 * 2**30, "peak": 0}
    for name in ("synchronize", "empty_cache", "reset_peak_memory_stats"):
        monkeypatch.setattr(torch.cuda, name, lambda *arguments: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 0)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: memory["peak"])
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (memory["free"], 2**40))
    spec = resolve_model(RunConfig(inputs=("x",), output="o", model=str(tiny_st("mean"))))
    probes = []

    def on_a_gpu(dtype):
        # A CPU encoder that takes itself for a GPU's: its probe is a real batch.
        encoder = build_encoder(spec, "cpu", dtype)
        encoder.device = "cuda:0"
        embed_batch = encoder.embed_batch

        def probed(batch):
            probes.append(encoder.cost(batch))
            memory["peak"] = 100_000 * encoder.cost(batch)
            return embed_batch(batch)

        encoder.embed_batch = probed
        return encoder

    first = on_a_gpu(torch.float32).measure_budget()
    assert probes == [8192] and first == budget_for_memory(10 * 2**30, 100_000, 128)
    # What the next run reads ahead by, before its model loads.
    assert recorded_budget(spec, "cuda:0", "float32") == first
    assert recorded_budget(spec, "cuda:0", "float16") is None
    assert recorded_budget(spec, "cpu", "float32") is None
    # Read ahead by it only where this run probes too: `auto`, or flat batches on CUDA
    # under a budget nobody gave.
    from bulkembed.encoders import kernels
    from bulkembed.encoders.registry import read_ahead_budget

    probing = replace(spec, probe_budget=True)
    assert read_ahead_budget(probing, "cuda:0", "float32") == first
    monkeypatch.setattr(kernels, "available", lambda device, dtype: [])
    assert read_ahead_budget(spec, "cuda:0", "float32") == spec.budget
    monkeypatch.setattr(kernels, "available", lambda device, dtype: ["varlen_attn"])
    assert read_ahead_budget(spec, "cuda:0", "float32") == first
    given = resolve_model(
        RunConfig(inputs=("x",), output="o", model=str(tiny_st("mean")), max_batch_tokens=4096)
    )
    assert read_ahead_budget(given, "cuda:0", "float32") == 4096
    # A later run of the same model on the same device: no probe, the memory free now.
    memory["free"] = 2 * 2**30
    again = on_a_gpu(torch.float32).measure_budget()
    assert len(probes) == 1 and again == budget_for_memory(2 * 2**30, 100_000, 128) < first
    # Another dtype (or device, model, library version) probes again.
    on_a_gpu(torch.bfloat16).measure_budget()
    assert len(probes) == 2
    # Each probe keeps its memory per token, and the budget it gave for reading ahead.
    recorded = [
        json.loads(p.read_text()) for p in (tmp_path / "cache" / "budget-probes").glob("*.json")
    ]
    assert sorted(map(sorted, recorded)) == [
        ["budget"],
        ["budget"],
        ["bytes_per_token"],
        ["bytes_per_token"],
    ]
    assert {r.get("bytes_per_token") for r in recorded} == {None, 100_000}


def test_flat_batches_on_cuda_probe_their_budget_unless_one_was_given(tiny_st, monkeypatch):
    from types import SimpleNamespace

    from bulkembed.encoders.registry import FLAT_BUDGET_VARIABLE, tunes_budget

    def encoder(device, unpadded, **options):
        config = RunConfig(inputs=("x",), output="o", model=str(tiny_st("mean")), **options)
        return SimpleNamespace(device=device, unpadded=unpadded, spec=resolve_model(config))

    monkeypatch.delenv(FLAT_BUDGET_VARIABLE, raising=False)
    assert tunes_budget(encoder("cuda:0", True))
    # A budget given, padded batches, a CPU: the budget stays, unless `auto` asked.
    assert not tunes_budget(encoder("cuda:0", True, max_batch_tokens=16384))
    assert not tunes_budget(encoder("cuda:0", False))
    assert not tunes_budget(encoder("cpu", True))
    assert tunes_budget(encoder("cuda:0", False, max_batch_tokens="auto"))
    assert tunes_budget(encoder("cpu", False, max_batch_tokens="auto"))
    monkeypatch.setenv(FLAT_BUDGET_VARIABLE, "recipe")
    assert not tunes_budget(encoder("cuda:0", True))


def test_max_batch_tokens_auto_keeps_the_default_on_cpu(tmp_path, tiny_st):
    model = tiny_st("mean")
    tuned, out = embed_texts(tmp_path / "a", model, sample_texts(20), "--max-batch-tokens", "auto")
    fixed, _ = embed_texts(tmp_path / "f", model, sample_texts(20))
    assert tuned.equals(fixed)
    summary = json.loads((out / "_bulkembed" / "summary.json").read_text())
    assert summary["max_batch_tokens"] == DEFAULT_MAX_BATCH_TOKENS


def test_max_batch_tokens_must_be_a_number_or_auto(tmp_path, tiny_st):
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": "one"}])
    args = ["run", str(corpus), "--model", str(tiny_st("mean")), "--output", str(tmp_path / "o")]
    result = CliRunner().invoke(app, [*args, "--max-batch-tokens", "lots"])
    assert result.exit_code == 2
    assert (
        result.output.strip()
        == "error: --max-batch-tokens lots: expected a number of tokens or auto"
    )


@pytest.mark.slow
def test_compiled_model_writes_the_vectors_of_the_eager_one(tmp_path, tiny_st):
    model = tiny_st("mean")
    texts = sample_texts(40)
    compiled, _ = embed_texts(tmp_path / "c", model, texts, "--compile", "--dtype", "float32")
    eager, _ = embed_texts(tmp_path / "e", model, texts, "--dtype", "float32")
    assert compiled.column("id").equals(eager.column("id"))
    a = np.stack(compiled.column("dense").to_numpy(zero_copy_only=False))
    b = np.stack(eager.column("dense").to_numpy(zero_copy_only=False))
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_cpu_attention_is_sdpa():
    assert attention_implementation("cpu", torch.float32) == "sdpa"
    assert attention_implementation("cpu", torch.bfloat16) == "sdpa"


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_cuda_budget_probe_fits_the_free_memory(tiny_st):
    spec = resolve_model(RunConfig(inputs=("x",), output="o", model=str(tiny_st("mean"))))
    encoder = build_encoder(spec, "cuda:0", torch.float16)
    budget = encoder.measure_budget()
    assert budget is not None and budget % spec.max_length == 0
    # The tuned budget runs without running out of memory.
    documents = budget // spec.max_length
    batch = TokenBatch(
        np.full(budget, spec.pad_token_id, dtype=np.int32),
        np.full(documents, spec.max_length, dtype=np.int32),
    )
    assert encoder.embed_batch(batch).dense.shape[0] == documents


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_cuda_run_with_tuned_budget_and_auto_dtype_matches_cpu(tmp_path, tiny_st):
    model = tiny_st("mean")
    texts = sample_texts(200)
    gpu, out = embed_texts(
        tmp_path / "g", model, texts, "--devices", "cuda:0", "--max-batch-tokens", "auto"
    )
    cpu, _ = embed_texts(tmp_path / "c", model, texts, "--devices", "cpu", "--dtype", "float32")
    summary = json.loads((out / "_bulkembed" / "summary.json").read_text())
    # The half precision `auto` picks must pass its check: a fallback to float32 fails here.
    assert summary["dtype"] == str(resolve_dtype(DType.AUTO, "cuda:0")).removeprefix("torch.")
    assert summary["dtype_check"].endswith("; kept")
    # The GPU computes a tiny model faster than the host feeds it: well below 1.
    assert 0 < summary["device_busy_fraction"] < 1
    a = np.stack(gpu.column("dense").to_numpy(zero_copy_only=False))
    b = np.stack(cpu.column("dense").to_numpy(zero_copy_only=False))
    assert (a * b).sum(axis=1).min() >= 0.999


def test_cpu_half_precision_is_autocast_over_float32_weights(tiny_st):
    spec = resolve_model(
        RunConfig(inputs=("x",), output="o", model=str(tiny_st("mean")), backend="torch")
    )
    full = build_encoder(spec, "cpu", torch.float32)
    half = build_encoder(spec, "cpu", torch.bfloat16)
    assert {p.dtype for p in half.model.parameters()} == {torch.float32}
    tokens, lengths, _ = TextTokenizer(TokenizerSettings(spec.tokenizer_json, 64))(sample_texts(20))
    batch = TokenBatch(tokens, lengths)
    a = full.embed_within_memory(batch).dense
    b = half.embed_within_memory(batch).dense
    assert not np.array_equal(a, b)  # the multiplies ran in bfloat16
    assert cosines(a, b).min() >= 0.999
    # The start-up check's bfloat16 twin shares the float32 weights.
    twin = full.in_dtype(torch.bfloat16)
    assert twin.model is full.model and twin.autocast and not full.autocast
    np.testing.assert_array_equal(twin.embed_within_memory(batch).dense, b)

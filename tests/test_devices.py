import numpy as np
import pytest
import torch
from conftest import sample_texts

from bulkembed.config import DType, RunConfig
from bulkembed.devices import cpu_threads_per_worker, resolve_device, resolve_devices, resolve_dtype
from bulkembed.encoders import TokenBatch, build_encoder
from bulkembed.errors import BulkembedError
from bulkembed.model_spec import resolve_model
from bulkembed.tokenize import TextTokenizer, TokenizerSettings

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


def test_auto_dtype_is_bfloat16_on_cpus_that_accelerate_it_and_float16_on_cuda(monkeypatch):
    from bulkembed import devices

    monkeypatch.setattr(devices, "cpu_accelerates_bfloat16", lambda: False)
    assert resolve_dtype(DType.AUTO, "cpu") is torch.float32
    monkeypatch.setattr(devices, "cpu_accelerates_bfloat16", lambda: True)
    assert resolve_dtype(DType.AUTO, "cpu") is torch.bfloat16
    assert resolve_dtype(DType.AUTO, "cuda:0") is torch.float16
    assert resolve_dtype(DType.FLOAT32, "cpu") is torch.float32
    assert resolve_dtype(DType.BFLOAT16, "cpu") is torch.bfloat16


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_half_precision_matches_cpu_float32(tiny_st, dtype):
    spec = resolve_model(RunConfig(inputs=("x",), output="o", model=str(tiny_st("mean"))))
    flat, lengths, _ = TextTokenizer(TokenizerSettings(spec.tokenizer_json, spec.max_length))(
        sample_texts(64)
    )
    batch = TokenBatch(flat, lengths)
    cpu = build_encoder(spec, "cpu", torch.float32).embed(batch).dense
    gpu = build_encoder(spec, "cuda:0", dtype).embed(batch).dense
    assert gpu.dtype == np.float32
    assert (cpu * gpu).sum(axis=1).min() >= 0.999


def test_a_run_turns_off_the_onednn_primitive_cache(tmp_path, tiny_st, monkeypatch):
    import os

    from conftest import write_jsonl
    from typer.testing import CliRunner

    from bulkembed.cli import app

    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": "memory stays flat"}])
    args = ["run", str(corpus), "--model", str(tiny_st("mean")), "--output", str(tmp_path / "o")]
    assert CliRunner().invoke(app, [*args, "--quiet", "--tokenize-workers", "0"]).exit_code == 0
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "0"

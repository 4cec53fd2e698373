"""`--devices cpu,cpu`: one encoder process per device, output identical to one worker's."""

import json
import shutil

import pyarrow.parquet as pq
import pytest
import torch
from helpers import records, run_cli, write_corpus

from bulkembed import devices, precision

# Batches small enough that each worker gets several.
BATCHES = ("--max-batch-tokens", 1024)


def _corpus(tmp_path):
    return write_corpus(tmp_path, records(400, prefix="d"), 200, row_group_size=50)


@pytest.mark.slow
def test_two_cpu_workers_write_what_one_writes(tmp_path, tiny_st, monkeypatch):
    corpus, model = _corpus(tmp_path), tiny_st("mean")
    monkeypatch.setattr(devices, "cpu_threads_per_worker", lambda found: 1)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each of the two workers runs
    try:
        one = run_cli(corpus, model, tmp_path / "one", "--devices", "cpu", *BATCHES, workers=None)
    finally:
        torch.set_num_threads(threads)
    assert one.exit_code == 0, one.output
    two = run_cli(corpus, model, tmp_path / "two", "--devices", "cpu,cpu", *BATCHES, workers=None)
    assert two.exit_code == 0, two.output
    assert pq.read_table(tmp_path / "two").equals(pq.read_table(tmp_path / "one"))


@pytest.mark.slow
def test_a_worker_that_cannot_load_the_model_is_a_one_line_error(tmp_path, tiny_st):
    model = tmp_path / "model"
    shutil.copytree(tiny_st("mean"), model)
    for weights in model.rglob("*.safetensors"):
        weights.unlink()
    options = ("--devices", "cpu,cpu", "--dtype", "float32")
    result = run_cli(_corpus(tmp_path), model, tmp_path / "out", *options, *BATCHES, workers=None)
    assert result.exit_code == 1
    assert "error: the encoder on cpu failed: ModelError:" in result.output


@pytest.mark.slow
@pytest.mark.parametrize(("threshold", "chosen"), [(1.5, "float32"), (0.9, "bfloat16")])
def test_auto_dtype_with_several_devices_is_checked_before_the_workers_start(
    tmp_path, tiny_st, monkeypatch, threshold, chosen
):
    monkeypatch.setattr(devices, "cpu_accelerates_bfloat16", lambda: True)
    monkeypatch.setattr(precision, "PARITY_THRESHOLD", threshold)
    corpus, model = _corpus(tmp_path), tiny_st("mean")
    result = run_cli(
        corpus, model, tmp_path / "auto", "--devices", "cpu,cpu", *BATCHES, workers=None
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "auto" / "_bulkembed" / "summary.json").read_text())
    assert summary["device"] == "cpu,cpu"
    assert summary["dtype"] == chosen
    assert summary["dtype_check"].startswith("bfloat16 against float32 on 64 document(s)")
    # The workers ran in the dtype chosen: the same table as a run told that dtype.
    told = run_cli(
        corpus,
        model,
        tmp_path / "told",
        "--devices",
        "cpu,cpu",
        "--dtype",
        chosen,
        *BATCHES,
        workers=None,
    )
    assert told.exit_code == 0, told.output
    assert pq.read_table(tmp_path / "auto").equals(pq.read_table(tmp_path / "told"))

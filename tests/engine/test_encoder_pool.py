"""`--devices cpu,cpu`: one encoder process per device, output identical to one worker's.

Parquet parts and a LanceDB table are written by the device processes themselves, unit by
unit (`bulkembed.engine.unit_pool`); a stream is written by the run's process, from the
batches the devices embed (`bulkembed.engine.pool`)."""

import json
import os
import re
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lancedb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from helpers import records, run_cli, write_corpus

from bulkembed import embed_corpus
from bulkembed.batching import windows
from bulkembed.config import RunConfig
from bulkembed.engine import pool, precision, unit_pool
from bulkembed.errors import BulkembedError
from bulkembed.models import devices
from bulkembed.sinks.parquet import ParquetSink

# What a faulty device process (`_start_faulty_unit`) does, and the file its first fault claims.
FAULT = "TEST_ENCODER_FAULT"
MARKER = "TEST_ENCODER_FAULT_MARKER"

# Batches and units small enough that each worker gets several.
BATCHES = ("--max-batch-tokens", 1024, "--records-per-unit", 50)
# The outputs the device processes write.
OUTPUTS = ["parts", "lancedb"]


@pytest.fixture(autouse=True)
def _small_windows(monkeypatch):
    """Windows of two batches (gathered in the run's process): several unit groups each."""
    monkeypatch.setattr(windows, "WINDOW_BATCHES", 2)


def _target(tmp_path: Path, name: str, output: str) -> str:
    folder = tmp_path / name
    return str(folder) if output == "parts" else f"lancedb://{folder}?table=t"


def _read(tmp_path: Path, name: str, output: str) -> pa.Table:
    """The output `name`, rows in id order."""
    folder = tmp_path / name
    if output == "parts":
        return pq.read_table(folder).sort_by("id")
    return lancedb.connect(folder).open_table("t").to_arrow().sort_by("id")


def _corpus(tmp_path):
    return write_corpus(tmp_path, records(400, prefix="d"), 200, row_group_size=50)


def _one_worker_run(corpus, model, out, monkeypatch, *options: str) -> None:
    """The reference output: one CPU worker, one thread, as each of two workers gets."""
    monkeypatch.setattr(devices, "cpu_threads_per_worker", lambda found: 1)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one = run_cli(corpus, model, out, "--devices", "cpu", *BATCHES, *options, workers=None)
    finally:
        torch.set_num_threads(threads)
    assert one.exit_code == 0, one.output


def _two_workers_run(corpus, model, tmp_path, output, *options: str) -> Any:
    """`--devices cpu,cpu` into the output "two"."""
    out = _target(tmp_path, "two", output)
    return run_cli(corpus, model, out, "--devices", "cpu,cpu", *BATCHES, *options, workers=None)


def _no_writes_here(monkeypatch) -> None:
    """Fail any Parquet part written by this process: device processes write their own."""

    def refuse(*_: Any) -> None:
        raise AssertionError("the run's process wrote a part")

    monkeypatch.setattr(ParquetSink, "write", refuse)


@pytest.mark.slow
@pytest.mark.parametrize("output", OUTPUTS)
def test_two_cpu_workers_write_what_one_writes(tmp_path, tiny_st, monkeypatch, output):
    corpus, model = _corpus(tmp_path), tiny_st("mean")
    _one_worker_run(corpus, model, _target(tmp_path, "one", output), monkeypatch)
    _no_writes_here(monkeypatch)
    two = _two_workers_run(corpus, model, tmp_path, output)
    assert two.exit_code == 0, two.output
    assert _read(tmp_path, "two", output).equals(_read(tmp_path, "one", output))
    if output == "parts":
        # Each unit committed once, in its own part, with its done-marker.
        parts = sorted(p.name for p in (tmp_path / "two").glob("*.parquet"))
        assert len(parts) == 8
        assert len(list((tmp_path / "two" / "_bulkembed" / "done").iterdir())) == 8
        assert not list((tmp_path / "two").glob(".*.tmp"))


@pytest.mark.slow
@pytest.mark.parametrize("quantize", ["int8", "uint8"])
def test_two_cpu_workers_quantize_with_the_ranges_one_run_calibrates(
    tmp_path, tiny_st, monkeypatch, quantize
):
    corpus, model = _corpus(tmp_path), tiny_st("mean")
    option = ("--quantize", quantize)
    _one_worker_run(corpus, model, _target(tmp_path, "one", "parts"), monkeypatch, *option)
    # The ranges are calibrated here, on the first window; the device processes write.
    _no_writes_here(monkeypatch)
    two = _two_workers_run(corpus, model, tmp_path, "parts", *option)
    assert two.exit_code == 0, two.output
    ranges = [
        json.loads((tmp_path / name / "_bulkembed" / "quantization.json").read_text())
        for name in ("one", "two")
    ]
    assert ranges[0] == ranges[1] and [len(r) for r in ranges[0]["ranges"]] == [32, 32]
    assert _read(tmp_path, "two", "parts").equals(_read(tmp_path, "one", "parts"))
    assert len(list((tmp_path / "two").glob("*.parquet"))) == 8


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
    # Windows of the usual size: the first one holds the check's 64 documents.
    monkeypatch.setattr(windows, "WINDOW_BATCHES", 32)
    _no_writes_here(monkeypatch)
    corpus, model = _corpus(tmp_path), tiny_st("mean")
    result = run_cli(
        corpus, model, tmp_path / "auto", "--devices", "cpu,cpu", *BATCHES, workers=None
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "auto" / "_bulkembed" / "summary.json").read_text())
    assert summary["device"] == "cpu,cpu"
    assert summary["dtype"] == chosen
    assert summary["dtype_check"].startswith("bfloat16 against float32 on 64 documents")
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


@dataclass
class _Faulty:
    """A worker's encoder that, at its third batch, kills its own process (`die`) or never
    answers (`hang`); only the first worker to get there, so that the run can go on."""

    embed: Any
    fault: str
    marker: Path
    batches: int = 0

    def __call__(self, batch: Any) -> Any:
        self.batches += 1
        if self.batches == 3 and self._first():
            if self.fault == "die":
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(600)
        return self.embed(batch)

    def _first(self) -> bool:
        try:
            os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True


def _start_faulty_unit(work: Any) -> tuple[_Faulty, Any]:
    """`bulkembed.engine.unit_pool._start`, with the fault at a third unit."""
    embed, about = START_UNIT_WORKER(work)
    return _Faulty(embed, os.environ[FAULT], Path(os.environ[MARKER])), about


START_UNIT_WORKER = unit_pool._start


def _with_fault(monkeypatch, tmp_path, fault):
    """Device processes (spawned: they read the environment) with `fault` at a third unit."""
    monkeypatch.setattr(unit_pool, "_start", _start_faulty_unit)
    monkeypatch.setenv(FAULT, fault)
    monkeypatch.setenv(MARKER, str(tmp_path / "fault"))


@pytest.mark.slow
@pytest.mark.parametrize("output", OUTPUTS)
def test_a_killed_encoder_s_work_runs_on_the_other_and_the_output_is_the_same(
    tmp_path, tiny_st, monkeypatch, output
):
    corpus, model = _corpus(tmp_path), tiny_st("mean")
    _one_worker_run(corpus, model, _target(tmp_path, "one", output), monkeypatch)
    _with_fault(monkeypatch, tmp_path, "die")
    two = _two_workers_run(corpus, model, tmp_path, output)
    assert two.exit_code == 0, two.output
    assert (tmp_path / "fault").exists()
    assert "warning: the encoder on cpu died (killed, or out of memory?): its " in two.output
    assert re.search(r"its \d+ unit groups? in flight run again on cpu", two.output)
    expected = _read(tmp_path, "one", output)
    got = _read(tmp_path, "two", output)
    # The group ran again whole, in the same windows and batches, and is in the output once.
    assert got.equals(expected)
    if output == "parts":
        assert sorted(p.name for p in (tmp_path / "two").iterdir() if p.name.startswith(".")) == []
    assert got["id"].to_pylist() == expected["id"].to_pylist()
    dense = "dense" if output == "parts" else "vector"
    np.testing.assert_allclose(
        np.stack(got[dense].to_numpy(zero_copy_only=False)),
        np.stack(expected[dense].to_numpy(zero_copy_only=False)),
        rtol=0,
        atol=1e-6,
    )


@pytest.mark.slow
@pytest.mark.parametrize("output", OUTPUTS)
def test_a_hung_encoder_is_a_one_line_error_naming_its_device(
    tmp_path, tiny_st, monkeypatch, output
):
    _with_fault(monkeypatch, tmp_path, "hang")
    monkeypatch.setenv("BULKEMBED_BATCH_TIMEOUT", "2")
    model = tiny_st("mean")
    started = time.monotonic()
    result = run_cli(
        _corpus(tmp_path),
        model,
        _target(tmp_path, "out", output),
        "--devices",
        "cpu,cpu",
        *BATCHES,
        workers=None,
    )
    assert result.exit_code == 1, result.output
    assert (tmp_path / "fault").exists()
    assert (
        "error: the encoder on cpu took more than 2 s for one batch (stuck or hung?); "
        "committed output is kept: run the same command again to resume"
    ) in result.output
    assert time.monotonic() - started < 60


@pytest.mark.parametrize(
    ("value", "seconds"), [(None, pool.BATCH_TIMEOUT_SECONDS), ("2.5", 2.5), ("900", 900.0)]
)
def test_the_batch_time_limit_comes_from_the_environment(monkeypatch, value, seconds):
    if value is None:
        monkeypatch.delenv("BULKEMBED_BATCH_TIMEOUT", raising=False)
    else:
        monkeypatch.setenv("BULKEMBED_BATCH_TIMEOUT", value)
    assert pool.batch_timeout() == seconds


@pytest.mark.parametrize("value", ["", "soon", "0", "-5", "inf", "nan"])
def test_a_batch_time_limit_that_is_not_seconds_is_refused(monkeypatch, value):
    monkeypatch.setenv("BULKEMBED_BATCH_TIMEOUT", value)
    with pytest.raises(BulkembedError, match="^BULKEMBED_BATCH_TIMEOUT must be seconds above 0"):
        pool.batch_timeout()


@pytest.mark.slow
def test_auto_dtype_with_nothing_to_embed_in_the_first_window_takes_float32(
    tmp_path, tiny_st, monkeypatch, export_cache
):
    """A --since run whose texts are all unchanged holds no document to check bfloat16 on
    (and no check was recorded before): the device processes run in float32, and every
    vector is carried over as it was."""
    monkeypatch.setattr(devices, "cpu_accelerates_bfloat16", lambda: True)
    corpus, model = _corpus(tmp_path), tiny_st("mean")
    first = run_cli(corpus, model, tmp_path / "old", *BATCHES)
    assert first.exit_code == 0, first.output
    shutil.rmtree(export_cache / "dtype-checks")
    _no_writes_here(monkeypatch)
    again = run_cli(
        corpus,
        model,
        tmp_path / "new",
        "--since",
        tmp_path / "old",
        "--devices",
        "cpu,cpu",
        *BATCHES,
        workers=None,
    )
    assert again.exit_code == 0, again.output
    summary = json.loads((tmp_path / "new" / "_bulkembed" / "summary.json").read_text())
    assert (summary["dtype"], summary["docs_this_run"], summary["unchanged"]) == ("float32", 0, 400)
    assert summary["dtype_check"] is None
    assert (
        pq.read_table(tmp_path / "new")
        .sort_by("id")
        .equals(pq.read_table(tmp_path / "old").sort_by("id"))
    )


@pytest.mark.slow
def test_auto_dtype_on_devices_fed_from_here_writes_the_check_s_sample_as_it_is(
    tmp_path, tiny_st, monkeypatch
):
    """To stdout the devices embed the batches this process sends (`EncoderPool`): the
    check's sample, embedded here in the dtype kept, goes out as the check made it, and the
    devices get the other documents only."""
    monkeypatch.setattr(devices, "cpu_accelerates_bfloat16", lambda: True)
    monkeypatch.setattr(precision, "PARITY_THRESHOLD", 0.9)
    monkeypatch.setattr(windows, "WINDOW_BATCHES", 32)
    checks, sent = [], []
    check_on_window = precision.check_on_window

    def kept_check(*arguments: Any) -> Any:
        checks.append(check_on_window(*arguments))
        return checks[-1]

    def counted(batches: Any) -> Any:
        for key, batch in batches:
            sent.append(0 if batch is None else len(batch))
            yield key, batch

    embed_stream = pool.EncoderPool.embed_stream
    monkeypatch.setattr(precision, "check_on_window", kept_check)
    monkeypatch.setattr(
        pool.EncoderPool, "embed_stream", lambda self, b, f: embed_stream(self, counted(b), f)
    )
    config = RunConfig(
        inputs=(str(_corpus(tmp_path)),),
        output="-",
        model=str(tiny_st("mean")),
        devices="cpu,cpu",
        max_batch_tokens=BATCHES[1],
        records_per_unit=BATCHES[3],
    )
    # A stream of the run's own, with a descriptor, for the device processes to inherit.
    with open(tmp_path / "stdout.jsonl", "w") as stdout:
        monkeypatch.setattr(sys, "stdout", stdout)
        embed_corpus(config)
    rows = [json.loads(line) for line in (tmp_path / "stdout.jsonl").read_text().splitlines()]
    assert len({r["id"] for r in rows}) == len(rows) == 400
    [checked] = checks
    assert str(checked.encoder.dtype) == "torch.bfloat16" and len(checked.sample) == 64
    assert sum(sent) == 400 - 64
    written = np.array([r["dense"] for r in rows[:64]], dtype=np.float32)
    assert np.array_equal(written, checked.sample.vectors.dense)


@pytest.mark.slow
def test_the_embedding_seconds_end_at_the_last_commit_not_at_the_pool_s_close(
    tmp_path, tiny_st, monkeypatch
):
    closing = unit_pool.UnitPool.close
    pause = 3.0

    def slow_close(self, failed: bool = False) -> None:
        time.sleep(pause)
        closing(self, failed)

    monkeypatch.setattr(unit_pool.UnitPool, "close", slow_close)
    result = _two_workers_run(_corpus(tmp_path), tiny_st("mean"), tmp_path, "parts")
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "two" / "_bulkembed" / "summary.json").read_text())
    after = summary["seconds"] - summary["startup_seconds"] - summary["embedding_seconds"]
    assert after >= pause, summary
    rate = summary["docs_this_run"] / summary["embedding_seconds"]
    assert summary["docs_per_s"] == pytest.approx(rate, rel=0.01)

"""Crashes and signals at any point: the rerun gives exactly the uninterrupted output."""

import json
import random
import re
import subprocess
import sys
import weakref

import numpy as np
import pytest
import torch
from fault_harness import run_forked
from helpers import read_output, records, run_cli, sample_texts, write_jsonl, write_mixed_corpus
from typer.testing import CliRunner

from bulkembed.cli import app
from bulkembed.encoders import DeviceInputs, DeviceOutputs, Encoder, TokenBatch
from bulkembed.errors import ModelError
from bulkembed.run_dir import RunDirectory

STAGES = ["tokenize", "encode", "write", "commit", "marked"]


def _corpus(tmp_path):
    """700 records in 121 units, with null texts and repeated ids among them."""
    texts = sample_texts(700)
    records = [{"id": f"doc-{i}", "text": t} for i, t in enumerate(texts)]
    for record in records[3:600:7]:
        record["text"] = None
    for record in records[300:320]:
        record["id"] = f"doc-{int(record['id'][4:]) - 300}"
    return write_mixed_corpus(tmp_path, records, 300, row_group_size=5), records


def _bad_records(out):
    lines = (out / "_bulkembed" / "bad_records.jsonl").read_text().splitlines()
    return sorted(lines)


def _arguments(corpus, model, out):
    return [
        "run", str(corpus), "--model", str(model), "--output", str(out), "--quiet",
        "--max-batch-tokens", "256", "--tokenize-workers", "1",
    ]  # fmt: skip


@pytest.mark.slow
def test_sigkill_at_20_points_then_rerun_equals_an_uninterrupted_run(tmp_path, tiny_st):
    corpus, records = _corpus(tmp_path)
    model = tiny_st("mean")
    reference_out = tmp_path / "reference"
    reference = CliRunner().invoke(app, _arguments(corpus, model, reference_out))
    assert reference.exit_code == 0, reference.output
    expected = read_output(reference_out)

    out = tmp_path / "out"
    rng = random.Random(20261122)
    points = [(rng.choice(STAGES), rng.randint(1, 3)) for _ in range(20)]
    for stage, n in points:
        killed = run_forked(stage, n, "SIGKILL", _arguments(corpus, model, out))
        assert killed.returncode == -9, (stage, n, killed.stderr[-2000:])
    assert {stage for stage, _ in points} == set(STAGES)
    assert len(RunDirectory(out).done_units()) < 130  # work was left for the final run

    final = subprocess.run(
        [sys.executable, "-m", "bulkembed", *_arguments(corpus, model, out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert final.returncode == 0, final.stderr
    resumed = read_output(out)  # also asserts that no id appears twice
    assert set(resumed) == set(expected)
    assert set(expected) == {r["id"] for r in records if r["text"] is not None}
    assert _bad_records(out) == _bad_records(reference_out)
    assert len(_bad_records(out)) == 100
    cosines = [float(np.dot(expected[key], resumed[key])) for key in expected]
    assert min(cosines) >= 0.9999
    assert not list(out.glob(".*.tmp")) and RunDirectory(out).lock_holder() is None


@pytest.mark.slow
@pytest.mark.parametrize(("signal_name", "code"), [("SIGTERM", 143), ("SIGINT", 130)])
def test_sigterm_and_sigint_stop_cleanly_and_say_how_to_resume(
    tmp_path, tiny_st, signal_name, code
):
    corpus, records = _corpus(tmp_path)
    out = tmp_path / "out"
    arguments = _arguments(corpus, tiny_st("mean"), out)
    stopped = run_forked("marked", 5, signal_name, arguments)
    assert stopped.returncode == code, stopped.stderr
    run = RunDirectory(out)
    done = run.done_units()
    kept = sum(r.rows for r in done.values())
    line = stopped.stderr.strip().splitlines()[-1]
    assert re.fullmatch(
        f"error: stopped by {signal_name}: [0-9,]+ documents kept \\({kept:,} in units done, "
        "[0-9,]+ saved for the next run\\), [0-9,]+ remain; run the same command again to resume",
        line,
    ), line
    # The windows embedded before the signal are written: their units are committed.
    assert len(done) >= 5
    assert not list(out.glob(".*.tmp")) and run.lock_holder() is None
    resumed = CliRunner().invoke(app, arguments)
    assert resumed.exit_code == 0, resumed.output
    assert set(read_output(out)) == {r["id"] for r in records if r["text"] is not None}


class _SmallMemoryEncoder(Encoder):
    """Runs out of CUDA memory on batches of more than three documents."""

    calls: list[int]

    @property
    def dense_dim(self) -> int:
        return 1

    def embed(self, inputs: DeviceInputs) -> DeviceOutputs:
        batch = inputs.batch
        self.calls.append(len(batch))
        if len(batch) > 3:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return DeviceOutputs(dense=torch.from_numpy(batch.lengths.reshape(-1, 1)).float())


def test_out_of_memory_halves_the_batch_until_it_fits(tiny_st):
    from bulkembed.config import RunConfig
    from bulkembed.models.model_spec import resolve_model

    spec = resolve_model(RunConfig(inputs=("x",), output="o", model=str(tiny_st("mean"))))
    encoder = _SmallMemoryEncoder(spec, "cpu", torch.float32)
    encoder.calls = []
    lengths = [5, 4, 4, 3, 3, 2, 2, 2, 1, 1]
    batch = TokenBatch.from_sequences([np.arange(n) for n in lengths])
    out = encoder.embed_within_memory(batch)
    assert out.dense[:, 0].tolist() == lengths
    assert encoder.calls == [10, 5, 2, 3, 5, 2, 3]
    with pytest.raises(ModelError, match="one document of 9 tokens does not fit in cpu memory"):
        encoder.calls = []
        _SingleDocumentTooLarge(spec, "cpu", torch.float32).embed_within_memory(
            TokenBatch.from_sequences([np.arange(9)])
        )


class _SingleDocumentTooLarge(_SmallMemoryEncoder):
    def embed(self, inputs: DeviceInputs) -> DeviceOutputs:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory.")


class _TokenMemoryEncoder(_SmallMemoryEncoder):
    """Runs out of CUDA memory on batches of more than 12 padded tokens."""

    def embed(self, inputs: DeviceInputs) -> DeviceOutputs:
        batch = inputs.batch
        self.calls.append(len(batch))
        if batch.padded_tokens > 12:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory.")
        return DeviceOutputs(dense=torch.from_numpy(batch.lengths.reshape(-1, 1)).float())


class _HoldsMemory:
    """Stands for the activations of a forward pass that ran out of memory."""


class _LeavesActivations(_SmallMemoryEncoder):
    """Allocates, then runs out of memory on batches of more than one document; records
    whether the last failed pass's allocation is still alive when the halves run."""

    def embed(self, inputs: DeviceInputs) -> DeviceOutputs:
        batch = inputs.batch
        self.calls.append(len(batch))
        if self.failed is not None:
            self.alive.append(self.failed() is not None)
        if len(batch) > 1:
            activations = _HoldsMemory()
            self.failed = weakref.ref(activations)
            raise torch.cuda.OutOfMemoryError("CUDA out of memory.")
        return DeviceOutputs(dense=torch.from_numpy(batch.lengths.reshape(-1, 1)).float())


@pytest.mark.parametrize("streamed", [False, True])
def test_the_halves_of_a_batch_run_after_the_failed_pass_let_go_of_its_memory(tiny_st, streamed):
    from bulkembed.config import RunConfig
    from bulkembed.models.model_spec import resolve_model

    spec = resolve_model(RunConfig(inputs=("x",), output="o", model=str(tiny_st("mean"))))
    encoder = _LeavesActivations(spec, "cpu", torch.float32)
    encoder.calls, encoder.alive, encoder.failed = [], [], None
    batch = TokenBatch.from_sequences([np.arange(n) for n in (3, 2)])
    if streamed:
        [(_, out)] = encoder.embed_stream([("b", batch)], lambda *_: None)
    else:
        out = encoder.embed_within_memory(batch)
    assert out.dense[:, 0].tolist() == [3, 2]
    assert encoder.calls == [2, 1, 1]
    assert encoder.alive == [False, False]


def test_a_batch_that_ran_out_of_memory_is_remembered_for_the_rest_of_the_run(tiny_st):
    from bulkembed.config import RunConfig
    from bulkembed.models.model_spec import resolve_model

    spec = resolve_model(RunConfig(inputs=("x",), output="o", model=str(tiny_st("mean"))))
    encoder = _TokenMemoryEncoder(spec, "cpu", torch.float32)
    encoder.calls = []
    eight = TokenBatch.from_sequences([np.arange(3)] * 8)  # 24 padded tokens
    assert encoder.embed_within_memory(eight).dense[:, 0].tolist() == [3] * 8
    assert encoder.calls == [8, 4, 4] and encoder.memory_limit == 24
    encoder.calls = []
    encoder.embed_within_memory(eight)
    assert encoder.calls == [4, 4]  # halved before it runs, not after it fails again
    encoder.calls = []
    five = TokenBatch.from_sequences([np.arange(4)] * 5)  # 20 padded tokens: tried
    assert encoder.embed_within_memory(five).dense[:, 0].tolist() == [4] * 5
    assert encoder.calls == [5, 2, 3] and encoder.memory_limit == 20


class _NotFiniteInHalfPrecision(_SmallMemoryEncoder):
    """Gives NaN where it computes in half precision, and in float32 too when `broken`."""

    broken = False

    def embed(self, inputs: DeviceInputs) -> DeviceOutputs:
        self.calls.append(str(self.dtype))
        dense = inputs.batch.lengths.reshape(-1, 1).astype(np.float32)
        if self.broken or self.dtype != torch.float32:
            dense[0, 0] = np.nan
        return DeviceOutputs(dense=torch.from_numpy(dense))


def test_a_batch_not_finite_on_a_gpu_is_embedded_again_in_float32_and_counted(tiny_st, monkeypatch):
    from bulkembed.config import RunConfig
    from bulkembed.models.model_spec import resolve_model

    class OnGPU(_NotFiniteInHalfPrecision):
        calls: list = []
        made: list = []

        def __init__(self, spec, device, dtype):
            super().__init__(spec, device, dtype)
            self.made.append((device, str(dtype)))

    # A simulated device: encoders made for cuda:0 compute on this CPU.
    monkeypatch.setattr(torch.cuda, "Stream", lambda device: None)
    spec = resolve_model(RunConfig(inputs=("x",), output="o", model=str(tiny_st("mean"))))
    encoder = OnGPU(spec, "cuda:0", torch.float16)
    assert not encoder.autocast and encoder.weights_dtype == torch.float16
    batch = TokenBatch.from_sequences([np.arange(n) for n in (3, 2, 1)])
    for _ in range(2):
        assert encoder.embed_within_memory(batch).dense[:, 0].tolist() == [3, 2, 1]
    assert encoder.counts.float32_retries == 2
    # The float32 twin is loaded once, on the same device, and kept.
    assert OnGPU.made == [("cuda:0", "torch.float16"), ("cuda:0", "torch.float32")]
    assert OnGPU.calls == ["torch.float16", "torch.float32"] * 2


def test_a_batch_that_is_not_finite_is_embedded_again_in_float32_or_refused(tiny_st):
    from bulkembed.config import RunConfig
    from bulkembed.models.model_spec import resolve_model

    spec = resolve_model(RunConfig(inputs=("x",), output="o", model=str(tiny_st("mean"))))
    batch = TokenBatch.from_sequences([np.arange(n) for n in (3, 2, 1)])
    encoder = _NotFiniteInHalfPrecision(spec, "cpu", torch.bfloat16)
    encoder.calls = []
    assert encoder.embed_within_memory(batch).dense[:, 0].tolist() == [3, 2, 1]
    assert encoder.calls == ["torch.bfloat16", "torch.float32"]
    assert encoder.counts.float32_retries == 1
    broken = _NotFiniteInHalfPrecision(spec, "cpu", torch.float32)
    broken.calls, broken.broken = [], True
    with pytest.raises(ModelError) as refused:
        broken.embed_within_memory(batch)
    assert str(refused.value) == (
        "the model gave values that are not finite (NaN or infinity) for a batch of 3 "
        "documents on cpu in float32: check the model's weights"
    )


def test_a_run_whose_half_precision_batches_are_not_finite_warns_once_and_counts_them(
    tmp_path, tiny_st, monkeypatch
):
    corpus = write_jsonl(tmp_path / "c.jsonl", records(40))
    options = ("--backend", "torch", "--max-batch-tokens", "256")
    reference = run_cli(corpus, tiny_st("mean"), tmp_path / "f32", "--dtype", "float32", *options)
    assert reference.exit_code == 0, reference.output
    launch = Encoder.launch

    def not_finite_in_bfloat16(self, inputs):
        landing = launch(self, inputs)
        if self.dtype == torch.bfloat16:
            embeddings = landing.embeddings
            landing.embeddings = lambda: (embeddings()[0], False)
        return landing

    monkeypatch.setattr(Encoder, "launch", not_finite_in_bfloat16)
    result = run_cli(corpus, tiny_st("mean"), tmp_path / "out", "--dtype", "bfloat16", *options)
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.output.splitlines() if line.startswith("warning:")]
    assert warnings == [
        "warning: a batch gave values that are not finite (NaN or infinity) in half "
        "precision: embedded again in float32, as any such batch is (counted in "
        "summary.json, float32_retries_this_run); --dtype float32 runs every batch in float32"
    ]
    summary = json.loads((tmp_path / "out" / "_bulkembed" / "summary.json").read_text())
    assert summary["float32_retries_this_run"] == summary["batches_this_run"] > 1
    assert read_output(tmp_path / "out") == read_output(tmp_path / "f32")

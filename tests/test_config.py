"""`RunConfig` as a Python caller builds it: strings for enums, one input as a string."""

import os

import pytest

from bulkembed.config import (
    DType,
    Engine,
    IndexType,
    Quantize,
    RunConfig,
    ShardSpec,
    StreamFormat,
    default_tokenize_workers,
)
from bulkembed.errors import BulkembedError


def test_strings_become_the_enums_and_one_input_path_is_one_input(tmp_path):
    config = RunConfig(
        inputs=str(tmp_path / "x.jsonl"),
        output=tmp_path / "out",
        model="m",
        dtype="float32",
        quantize="binary",
        engine="local",
        shard="1/3",
        keep_columns="title",
    )
    assert config.inputs == (str(tmp_path / "x.jsonl"),)
    assert config.output == str(tmp_path / "out")
    assert config.dtype is DType.FLOAT32
    assert config.quantize is Quantize.BINARY
    assert config.engine is Engine.LOCAL
    assert config.shard == ShardSpec(1, 3)
    assert config.keep_columns == ("title",)
    stream = RunConfig(inputs=("a", "b"), output="-", model="m", stream_format="arrow")
    assert stream.inputs == ("a", "b") and stream.stream_format is StreamFormat.ARROW
    lance = RunConfig(inputs="a", output="lancedb://db", model="m", index_type="ivf_pq")
    assert lance.index_type is IndexType.IVF_PQ


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("dtype", "f32", "--dtype: choose one of auto, float32, float16, bfloat16 (got 'f32')"),
        ("on_bad_record", "ignore", "--on-bad-record: choose skip or fail (got 'ignore')"),
        ("pooling", "max", "--pooling: choose one of cls, mean, last-token (got 'max')"),
        ("shard", "3/3", "--shard 3/3: expected I/N with 0 <= I < N"),
    ],
)
def test_a_bad_value_is_one_line_before_anything_loads(field, value, message):
    with pytest.raises(BulkembedError) as raised:
        RunConfig(inputs="a.jsonl", output="out", model="m", **{field: value})
    assert str(raised.value).startswith(message)


@pytest.mark.parametrize(
    ("cores", "devices", "expected"),
    [
        (2, ["cpu"], 1),
        (64, ["cpu", "cpu"], 1),
        (16, ["cuda:0"], 4),
        (64, [f"cuda:{i}" for i in range(8)], 32),
        (16, [f"cuda:{i}" for i in range(8)], 7),
        (4, [f"cuda:{i}" for i in range(4)], 1),
    ],
)
def test_tokenizer_processes_grow_with_the_gpus_within_the_cores_left(
    monkeypatch, cores, devices, expected
):
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    assert default_tokenize_workers(devices) == expected


@pytest.mark.parametrize(
    ("option", "spelling"),
    [("max_deletes", "lots"), ("max_bad_records", "many"), ("max_batch_tokens", "big")],
)
def test_run_config_takes_the_clis_spellings_with_the_clis_errors(tmp_path, option, spelling):
    from typer.testing import CliRunner

    from bulkembed import RunConfig, UsageError
    from bulkembed.cli import app

    config = RunConfig(
        inputs="x", output="o", model="m", max_batch_tokens="auto", max_deletes="all"
    )
    assert (config.max_batch_tokens, config.probe_budget, config.max_deletes) == (
        None,
        True,
        None,
    )
    counted = RunConfig(inputs="x", output="o", model="m", max_bad_records="25")
    assert (counted.max_bad_records, counted.probe_budget) == (25, False)
    shares = RunConfig(
        inputs="x", output="o", model="m", max_deletes="0.25", max_bad_records="0.01"
    )
    assert (shares.max_deletes, shares.max_bad_records) == (0.25, 0.01)
    assert (
        RunConfig(inputs="x", output="o", model="m", max_batch_tokens="4096").max_batch_tokens
        == 4096
    )
    with pytest.raises(UsageError) as refused:
        RunConfig(inputs="x", output="o", model="m", **{option: spelling})
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "a"}\n')
    flag = f"--{option.replace('_', '-')}"
    result = CliRunner().invoke(
        app, ["run", str(corpus), "--model", "m", "-o", str(tmp_path / "o"), flag, spelling]
    )
    assert result.exit_code == 2
    assert result.output.strip() == f"error: {refused.value}"

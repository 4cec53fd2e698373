"""`RunConfig` as a Python caller builds it: strings for enums, one input as a string."""

import os

import pytest

from bulkembed.config import (
    RUNTIME_SETTINGS,
    VECTOR_SETTINGS,
    BatchSettings,
    DType,
    Engine,
    IndexType,
    InputSettings,
    ModelSettings,
    OutputSettings,
    Quantize,
    RunConfig,
    RunSettings,
    ShardSpec,
    StreamFormat,
    default_tokenize_workers,
)
from bulkembed.errors import BulkembedError, UsageError


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
    assert config.inputs.paths == (str(tmp_path / "x.jsonl"),)
    assert config.output.target == str(tmp_path / "out")
    assert config.batching.dtype is DType.FLOAT32
    assert config.model.quantize is Quantize.BINARY
    assert config.run.engine is Engine.LOCAL
    assert config.run.shard == ShardSpec(1, 3)
    assert config.output.keep_columns == ("title",)
    stream = RunConfig(inputs=("a", "b"), output="-", model="m", stream_format="arrow")
    assert stream.inputs.paths == ("a", "b") and stream.output.stream_format is StreamFormat.ARROW
    lance = RunConfig(inputs="a", output="lancedb://db", model="m", index_type="ivf_pq")
    assert lance.output.index_type is IndexType.IVF_PQ


def test_the_groups_make_the_same_configuration_as_the_flat_keywords():
    flat = RunConfig(
        inputs="a.jsonl",
        output="out",
        model="m",
        dim=64,
        devices="cpu",
        max_batch_tokens="auto",
        keep_columns=("title",),
        since="prev",
        text_column="body",
    )
    grouped = RunConfig(
        inputs=InputSettings("a.jsonl", text_column="body"),
        output=OutputSettings("out", keep_columns=("title",)),
        model=ModelSettings("m", dim=64),
        batching=BatchSettings(devices="cpu", max_batch_tokens="auto"),
        run=RunSettings(since="prev"),
    )
    assert grouped == flat
    assert flat.batching == BatchSettings("cpu", max_batch_tokens=None, probe_budget=True)
    # A group given whole takes flat keywords as changes; `changed` takes the flat names.
    assert RunConfig(inputs="a.jsonl", output="out", model=ModelSettings("m", dim=64), dim=32) == (
        flat.changed(dim=32, devices="auto", max_batch_tokens=None, probe_budget=False).changed(
            keep_columns=(), since=None, text_column="text"
        )
    )
    moved = flat.changed(output="elsewhere", overwrite=True)
    assert (moved.output.target, moved.output.keep_columns, moved.run) == (
        "elsewhere",
        ("title",),
        RunSettings(since="prev", overwrite=True),
    )
    with pytest.raises(TypeError, match="unexpected setting 'colour'"):
        RunConfig(inputs="a", output="o", model="m", colour="red")


def test_what_an_output_records_is_read_off_the_model_group():
    assert VECTOR_SETTINGS == (
        "revision",
        "recipe",
        "pooling",
        "normalize",
        "prompt",
        "outputs",
        "sparse_top_k",
        "dim",
        "dtype_out",
        "quantize",
        "max_length",
    )
    assert RUNTIME_SETTINGS == (
        "devices",
        "dtype",
        "compile",
        "backend",
        "attention",
        "max_batch_tokens",
    )


@pytest.mark.parametrize(
    ("group", "settings", "message"),
    [
        (InputSettings, {"paths": ()}, "no input given"),
        (InputSettings, {"paths": ("-", "-")}, "stdin (-) can be given as an input once"),
        (ModelSettings, {"name": "m", "prompt": "a", "prompt_name": "b"}, "--prompt and"),
        (ModelSettings, {"name": "m", "outputs": "colbert"}, "--outputs: unknown output"),
        (BatchSettings, {"backend": "openvino", "compile": True}, "--compile and --backend"),
        (BatchSettings, {"max_batch_tokens": "0"}, "--max-batch-tokens must be at least 1"),
        (OutputSettings, {"target": "o", "keep_columns": "id"}, "--keep-columns: id is"),
        (RunSettings, {"ray_address": "auto"}, "--ray-address applies to --engine ray"),
        (RunSettings, {"max_deletes": "lots"}, "--max-deletes lots: give a count"),
    ],
)
def test_each_group_checks_itself(group, settings, message):
    with pytest.raises(UsageError) as refused:
        group(**settings)
    assert str(refused.value).startswith(message)
    assert "\n" not in str(refused.value)


def test_what_two_groups_say_together_is_checked_across_them():
    with pytest.raises(UsageError, match="--index needs float vectors"):
        RunConfig(inputs="a", output="lancedb://db", model="m", index=True, quantize="int8")
    with pytest.raises(UsageError, match="--shard cannot be combined with --limit"):
        RunConfig(inputs="a", output="o", model="m", shard="0/2", limit=5)
    with pytest.raises(UsageError, match="input from stdin"):
        RunConfig(inputs="-", output="o", model="m", since="prev")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        (
            "dtype",
            "f32",
            "--dtype: choose one of auto, float32, float16, bfloat16, int8-weights, int8 "
            "(got 'f32')",
        ),
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

    from bulkembed.cli import app

    config = RunConfig(
        inputs="x", output="o", model="m", max_batch_tokens="auto", max_deletes="all"
    )
    assert (
        config.batching.max_batch_tokens,
        config.batching.probe_budget,
        config.run.max_deletes,
    ) == (
        None,
        True,
        None,
    )
    counted = RunConfig(inputs="x", output="o", model="m", max_bad_records="25")
    assert (counted.run.max_bad_records, counted.batching.probe_budget) == (25, False)
    shares = RunConfig(
        inputs="x", output="o", model="m", max_deletes="0.25", max_bad_records="0.01"
    )
    assert (shares.run.max_deletes, shares.run.max_bad_records) == (0.25, 0.01)
    assert (
        RunConfig(
            inputs="x", output="o", model="m", max_batch_tokens="4096"
        ).batching.max_batch_tokens
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


def test_the_settings_and_the_errors_are_exported_from_the_package():
    import bulkembed
    from bulkembed import ModelError
    from bulkembed import UsageError as Exported

    assert (bulkembed.RunConfig, bulkembed.ModelSettings) == (RunConfig, ModelSettings)
    assert Exported is UsageError and issubclass(ModelError, BulkembedError)

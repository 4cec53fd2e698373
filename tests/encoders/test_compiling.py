"""Whether a run compiles its model when `--compile` was not given, and where the
compiler's cache goes."""

import json
import os

import torch
from helpers import embed_texts, sample_texts

from bulkembed.config import RunConfig
from bulkembed.contracts import RUN_DIRECTORY
from bulkembed.encoders import base, compiling
from bulkembed.encoders.compiling import (
    BYTES_PER_TOKEN,
    CACHE_VARIABLE,
    COMPILE_WORK_FLOPS,
    compiled,
    compiles_by_default,
    layer_parameters,
)
from bulkembed.models.model_spec import resolve_model


def _spec(folder, **options):
    return resolve_model(RunConfig(inputs=("x",), output="o", model=str(folder), **options))


def test_a_run_compiles_by_default_on_cuda_when_its_inputs_hold_enough_work(tiny_st):
    spec = _spec(tiny_st("mean"))
    config = json.loads((tiny_st("mean") / "config.json").read_text())
    # 2 layers of hidden 32 and inner 64: 2 * (4 * 32² + 2 * 32 * 64) = 16,384 parameters.
    assert layer_parameters(config) == 16_384
    enough = int(COMPILE_WORK_FLOPS * BYTES_PER_TOKEN / (2 * 16_384))
    assert compiles_by_default(spec, "cuda:0", enough)
    assert not compiles_by_default(spec, "cuda:0", enough - 1)
    # Not on a CPU, not with OpenVINO, not for inputs of unknown size.
    assert not compiles_by_default(spec, "cpu", 100 * enough)
    assert not compiles_by_default(_spec(tiny_st("mean"), backend="openvino"), "cuda:0", enough)
    assert not compiles_by_default(spec, "cuda:0", 0)


def test_compile_and_no_compile_decide_outright_and_the_summary_says(
    tmp_path, tiny_st, monkeypatch
):
    model = tiny_st("mean")
    texts = sample_texts(6)
    decided = []
    monkeypatch.setattr(base, "compiled", lambda module: decided.append(module) or module)
    for flag, expected in (("--no-compile", False), ("--compile", True), (None, False)):
        arguments = ["--backend", "torch"] + ([flag] if flag else [])
        _, out = embed_texts(tmp_path / str(flag), model, texts, *arguments)
        summary = json.loads((out / RUN_DIRECTORY / "summary.json").read_text())
        assert summary["compile"] is expected, flag
    assert len(decided) == 1


def test_the_compilers_cache_is_kept_in_the_cache_folder_unless_set(tmp_path, monkeypatch):
    monkeypatch.setenv("BULKEMBED_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(CACHE_VARIABLE, "placeholder")
    monkeypatch.delenv(CACHE_VARIABLE)
    compiled(torch.nn.Linear(2, 2))
    assert os.environ[CACHE_VARIABLE] == str(tmp_path / "cache" / "torch-compile")
    monkeypatch.setenv(CACHE_VARIABLE, str(tmp_path / "mine"))
    compiled(torch.nn.Linear(2, 2))
    assert os.environ[CACHE_VARIABLE] == str(tmp_path / "mine")


def test_the_run_compiles_where_the_rule_says_so(tmp_path, tiny_st, monkeypatch):
    decided = []
    monkeypatch.setattr(base, "compiled", lambda module: decided.append(module) or module)
    rules = []

    def rule(spec, device, input_bytes):
        rules.append((device, input_bytes))
        return True

    monkeypatch.setattr(compiling, "compiles_by_default", rule)
    texts = sample_texts(6)
    _, out = embed_texts(tmp_path / "ruled", tiny_st("mean"), texts, "--backend", "torch")
    summary = json.loads((out / RUN_DIRECTORY / "summary.json").read_text())
    corpus = tmp_path / "ruled" / "c.jsonl"
    assert rules == [("cpu", corpus.stat().st_size)]
    assert summary["compile"] is True and len(decided) == 1

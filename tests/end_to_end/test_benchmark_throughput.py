"""benchmarks/throughput.py: its ratios and table from per-round figures, and its peers'
processes (load once, embed on request, report what stops them loading)."""

import json
import sys

import numpy as np
import pytest
from peers import PeerProcess
from throughput import markdown, ratio_table, spread

PER_ROUND = {
    "sentence_transformers_float32": [1000.0, 800.0, 1200.0],
    "sentence_transformers_bf16_autocast": [2000.0, 2000.0, 1600.0],
    "fastembed_onnx": [1500.0, 1000.0, 1250.0],
    "bulkembed_float32": [1500.0, 1200.0, 1500.0],
    "bulkembed_auto": [3000.0, 2400.0, 2400.0],
}


def _configurations() -> dict[str, dict]:
    dtypes = {"sentence_transformers_bf16_autocast": "bfloat16", "bulkembed_auto": "bfloat16"}
    configurations = {}
    for name, rates in PER_ROUND.items():
        run = {"dtype": dtypes.get(name, "float32"), "tokens_per_s": spread(rates)}
        if name.startswith("bulkembed"):
            run["command"] = f"bulkembed run --dtype {name.removeprefix('bulkembed_')}"
        configurations[name] = {**run, "lowest_cosine": 0.9999685}
    return configurations


def test_ratios_are_per_round_against_the_reference_the_fastest_peer_and_autocast():
    ratios = ratio_table(_configurations(), PER_ROUND)
    assert ratios == {
        # 1500/1000, 1200/800, 1500/1200
        "bulkembed_float32 / sentence_transformers_float32": {
            "median": 1.5,
            "min": 1.25,
            "max": 1.5,
        },
        # FastEmbed's median, 1250, is the fastest float32 peer's: 1500/1500, 1200/1000, ...
        "bulkembed_float32 / fastembed_onnx": {"median": 1.2, "min": 1.0, "max": 1.2},
        "bulkembed_auto / sentence_transformers_bf16_autocast": {
            "median": 1.5,
            "min": 1.2,
            "max": 1.5,
        },
    }


def test_markdown_table_has_one_row_per_configuration():
    table = markdown(_configurations(), PER_ROUND).splitlines()
    assert len(table) == 2 + len(PER_ROUND)
    assert table[2] == (
        "| sentence-transformers `encode(batch_size=32)` | float32 | 1,000 (800-1,200) "
        "| 1.00 | 0.9999685 |"
    )
    # 3000/1000, 2400/800, 2400/1200: median 3
    assert table[-1] == (
        "| `bulkembed run --dtype auto` | bfloat16 | 2,400 (2,400-3,000) | 3.00 | 0.9999685 |"
    )


@pytest.mark.slow
def test_peer_process_loads_once_and_embeds_like_sentence_transformers(tiny_st, tmp_path):
    from sentence_transformers import SentenceTransformer

    folder = tiny_st("mean")
    texts = ["a short one", "the tokenizer was trained on the sample " * 20, "x"]
    texts_file = tmp_path / "texts.json"
    texts_file.write_text(json.dumps(texts))
    peer = PeerProcess(
        "sentence_transformers_float32", sys.executable, folder, texts_file, tmp_path
    )
    report = peer.ready()
    assert sorted(report) == ["export_seconds", "load_seconds", "versions"]
    assert report["export_seconds"] == 0.0
    assert "torch" in report["versions"]
    assert peer.encode(save=True) > 0
    assert peer.encode(save=False) > 0
    peer.close()
    assert peer.process.returncode == 0
    expected = SentenceTransformer(str(folder), device="cpu").encode(
        texts, batch_size=32, normalize_embeddings=True
    )
    np.testing.assert_allclose(np.load(peer.vectors_file), expected, atol=1e-6)


@pytest.mark.slow
def test_peer_that_cannot_load_says_why_and_exits(tmp_path):
    texts_file = tmp_path / "texts.json"
    texts_file.write_text(json.dumps(["a"]))
    # A model folder without the model: the loader's own error, on one line.
    empty = tmp_path / "empty-model"
    empty.mkdir()
    peer = PeerProcess("sentence_transformers_float32", sys.executable, empty, texts_file, tmp_path)
    report = peer.ready()
    peer.close()
    assert list(report) == ["error"]
    assert "\n" not in report["error"]
    assert str(empty) in report["error"]
    assert peer.process.returncode == 0

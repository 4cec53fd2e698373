"""int8 on the CPU: `--dtype auto` tries int8-weights on CPUs that multiply int8 and not
bfloat16, `--dtype int8` asks for static int8; each is kept only where a check against
float32 passes, and a run never mixes int8 and float32 vectors."""

import json
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
from fault_harness import run_forked
from helpers import read_output, records, run_cli, write_jsonl

from bulkembed.config import DType
from bulkembed.encoders import int8
from bulkembed.engine import int8_check
from bulkembed.engine.int8_check import Int8Record, window_calibration
from bulkembed.engine.precision import neighbour_agreement
from bulkembed.models import devices
from bulkembed.models.file_digests import cache_root
from bulkembed.run_dir import RunDirectory

pytestmark = pytest.mark.skipif(not int8.nncf_installed(), reason="needs nncf")


@pytest.fixture
def int8_cpu(monkeypatch):
    """A CPU that multiplies int8 in hardware and bfloat16 not (a VNNI-only Xeon)."""
    monkeypatch.delenv(int8.AUTO_VARIABLE, raising=False)
    monkeypatch.setattr(devices, "cpu_accelerates_bfloat16", lambda: False)
    monkeypatch.setattr(devices, "cpu_multiplies_int8", lambda: True)


def _summary(out):
    return json.loads((out / "_bulkembed" / "summary.json").read_text())


def _run(tmp_path, model, out, *extra, documents=100):
    corpus = write_jsonl(tmp_path / "corpus" / "c.jsonl", records(documents))
    result = run_cli(corpus, model, tmp_path / out, *extra)
    assert result.exit_code == 0, result.output
    return result, _summary(tmp_path / out)


def _lowest_cosine(a, b):
    return min(float(np.dot(a[k], b[k])) for k in a)


@pytest.mark.slow
def test_auto_takes_int8_weights_on_an_int8_cpu_and_bfloat16_on_a_bfloat16_cpu(
    tmp_path, minilm, int8_cpu, monkeypatch
):
    _, reference = _run(tmp_path, minilm, "float32", "--dtype", "float32")
    result, summary = _run(tmp_path, minilm, "auto-int8")
    assert summary["dtype"] == "int8-weights"
    assert summary["dtype_check"].startswith("int8-weights against float32 on 64 documents: ")
    assert summary["dtype_check"].endswith("; kept")
    assert "warning" not in result.output
    lowest = _lowest_cosine(read_output(tmp_path / "float32"), read_output(tmp_path / "auto-int8"))
    # Not float32's vectors, and near them.
    assert 0.99 < lowest < 0.99999
    record = json.loads((tmp_path / "auto-int8" / "_bulkembed" / "int8.json").read_text())
    assert record["tried"] == "int8-weights" and record["dense"] >= 0.995
    assert "calibration" not in record

    monkeypatch.setattr(devices, "cpu_accelerates_bfloat16", lambda: True)
    _, summary = _run(tmp_path, minilm, "auto-bf16")
    assert summary["dtype"] == "bfloat16"
    assert not (tmp_path / "auto-bf16" / "_bulkembed" / "int8.json").exists()

    # Without int8 units, or with BULKEMBED_AUTO_INT8=0: float32, unchecked.
    monkeypatch.setattr(devices, "cpu_accelerates_bfloat16", lambda: False)
    monkeypatch.setattr(devices, "cpu_multiplies_int8", lambda: False)
    _, summary = _run(tmp_path, minilm, "auto-avx2")
    assert (summary["dtype"], summary["dtype_check"]) == ("float32", None)
    monkeypatch.setattr(devices, "cpu_multiplies_int8", lambda: True)
    monkeypatch.setenv(int8.AUTO_VARIABLE, "0")
    _, summary = _run(tmp_path, minilm, "auto-off")
    assert (summary["dtype"], summary["dtype_check"]) == ("float32", None)
    assert read_output(tmp_path / "auto-off") == read_output(tmp_path / "float32")
    assert reference["docs"] == 100


@pytest.mark.slow
def test_a_broken_int8_model_is_rejected_and_the_run_goes_on_in_float32(
    tmp_path, minilm, monkeypatch
):
    import nncf

    def broken(graph, mode, calibration, folder):
        # Quantized without the transformer model type: attention's inputs and the layer
        # norms' are quantized too, and the vectors are another model's.
        quantized = nncf.quantize(graph.clone(), nncf.Dataset(calibration.inputs()))
        int8.import_openvino().save_model(quantized, folder / "model.xml")

    monkeypatch.setattr(int8, "quantize", broken)
    # Not the cache folder of a sane model.
    monkeypatch.setattr(int8, "QUANTIZATION_FORMAT", -1)
    _run(tmp_path, minilm, "float32", "--dtype", "float32")
    result, summary = _run(tmp_path, minilm, "int8", "--dtype", "int8")
    assert summary["dtype"] == "float32"
    warnings = [line for line in result.output.splitlines() if line.startswith("warning")]
    assert len(warnings) == 1, result.output
    assert warnings[0].startswith("warning: --dtype int8: int8 against float32 on 64 documents")
    assert warnings[0].endswith("below cosine 0.95, top-5 agreement 0.85: running in float32"), (
        warnings[0]
    )
    found = json.loads((tmp_path / "int8" / "_bulkembed" / "int8.json").read_text())
    assert found["dense"] < 0.95 or found["neighbours"] < 0.85
    assert _lowest_cosine(read_output(tmp_path / "float32"), read_output(tmp_path / "int8")) > (
        0.99999
    )


@pytest.mark.slow
def test_since_refuses_an_output_of_another_int8_choice(tmp_path, tiny_st, int8_cpu, monkeypatch):
    model = tiny_st("mean")
    monkeypatch.setattr(devices, "cpu_accelerates_bfloat16", lambda: True)
    _run(tmp_path, model, "bf16")
    monkeypatch.setattr(devices, "cpu_accelerates_bfloat16", lambda: False)
    corpus = tmp_path / "corpus" / "c.jsonl"
    result = run_cli(corpus, model, tmp_path / "next", "--since", tmp_path / "bf16")
    assert result.exit_code == 2
    assert (
        result.output.strip()
        .splitlines()[-1]
        .endswith(
            "was made with other settings (--dtype's int8: None -> 'int8-weights'): its vectors "
            "cannot be reused; run without --since"
        )
    ), result.output
    # An output of the same choice is taken, with its decision.
    _run(tmp_path, model, "int8")
    _, summary = _run(tmp_path, model, "next", "--since", tmp_path / "int8")
    assert summary["dtype"] == "int8-weights" and summary["docs_this_run"] == 0
    assert (tmp_path / "next" / "_bulkembed" / "int8.json").read_bytes() == (
        tmp_path / "int8" / "_bulkembed" / "int8.json"
    ).read_bytes()


@pytest.mark.slow
def test_a_resumed_run_replays_its_decision_and_calibration(tmp_path, tiny_st):
    model = tiny_st("mean")
    corpus = write_jsonl(tmp_path / "corpus" / "c.jsonl", records(600))
    common = ("--dtype", "int8", "--records-per-unit", "100", "--max-batch-tokens", "256")
    reference = run_cli(corpus, model, tmp_path / "reference", *common)
    assert reference.exit_code == 0, reference.output
    assert _summary(tmp_path / "reference")["dtype"] == "int8"
    batches = _summary(tmp_path / "reference")["batches_this_run"]

    out = tmp_path / "out"
    arguments = ["run", str(corpus), "--model", str(model), "--output", str(out), "--quiet"]
    stopped = run_forked("encode", batches * 2 // 3, "SIGKILL", [*arguments, *common])
    assert stopped.returncode != 0
    done = RunDirectory(out).done_units()
    assert 0 < len(done) < 6
    record = Int8Record.of(RunDirectory(out)).read()
    assert record is not None and record[1] is not None
    # Whatever the export cache holds: the run directory's decision is the one replayed.
    for kind in ("int8-checks", "openvino-int8"):
        shutil.rmtree(cache_root() / kind, ignore_errors=True)
    resumed = run_cli(corpus, model, out, *common)
    assert resumed.exit_code == 0, resumed.output
    summary = _summary(out)
    assert summary["dtype"] == "int8"
    assert summary["dtype_check"].endswith(
        "(recorded by an earlier run of this model on this device)"
    )
    again = Int8Record.of(RunDirectory(out)).read()
    assert again is not None and again[1].digest == record[1].digest
    assert _lowest_cosine(read_output(tmp_path / "reference"), read_output(out)) >= 0.9999


def test_explicit_int8_refuses_what_it_cannot_run(tmp_path, tiny_bge_m3, tiny_st):
    corpus = write_jsonl(tmp_path / "corpus" / "c.jsonl", records(10))
    result = run_cli(corpus, tiny_bge_m3, tmp_path / "m3", "--dtype", "int8")
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1] == (
        "error: --dtype int8: int8 is checked for dense vectors only, and this run writes "
        "sparse or multi-vectors; pick --dtype float32 or auto"
    )
    result = run_cli(
        corpus, tiny_st("mean"), tmp_path / "t", "--dtype", "int8-weights", "--backend", "torch"
    )
    assert result.exit_code == 2
    assert "int8 runs on the OpenVINO backend" in result.output
    result = run_cli(
        corpus, tiny_st("mean"), tmp_path / "two", "--dtype", "int8", "--devices", "cpu,cpu"
    )
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1] == (
        "error: --dtype int8: int8 is checked in one process on one device, not on a Ray "
        "cluster or several devices; pick --dtype float32 or auto"
    )


@pytest.mark.slow
def test_auto_on_several_cpu_workers_stays_in_float(tmp_path, tiny_st, int8_cpu):
    _, summary = _run(tmp_path, tiny_st("mean"), "two", "--devices", "cpu,cpu")
    assert (summary["dtype"], summary["dtype_check"]) == ("float32", None)


@pytest.mark.slow
def test_a_resumed_int8_run_that_cannot_make_its_model_again_stops(tmp_path, tiny_st, monkeypatch):
    model = tiny_st("mean")
    corpus = write_jsonl(tmp_path / "corpus" / "c.jsonl", records(600))
    common = ("--dtype", "int8", "--records-per-unit", "100", "--max-batch-tokens", "256")
    out = tmp_path / "out"
    arguments = ["run", str(corpus), "--model", str(model), "--output", str(out), "--quiet"]
    stopped = run_forked("encode", 80, "SIGKILL", [*arguments, *common])
    assert stopped.returncode != 0
    kept = Int8Record.of(RunDirectory(out)).read()
    assert kept is not None and kept[0]["tried"] == "int8"
    shutil.rmtree(cache_root() / "openvino-int8", ignore_errors=True)

    def fails(graph, mode, calibration, folder):
        raise RuntimeError("no kernel for this CPU")

    monkeypatch.setattr(int8, "quantize", fails)
    resumed = run_cli(corpus, model, out, *common)
    assert resumed.exit_code != 0
    assert (
        resumed.output.strip()
        .splitlines()[-1]
        .endswith(
            "no kernel for this CPU; the run's vectors so far are int8: install what made them, "
            "or start over with --overwrite"
        )
    ), resumed.output


def test_neighbour_agreement_counts_shared_nearest_neighbours():
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(20, 8))
    assert neighbour_agreement(vectors, vectors) == 1.0
    # Every neighbour list reversed in rank but for the nearest: the same sets.
    assert neighbour_agreement(vectors, vectors * 3.0) == 1.0
    shuffled = vectors[rng.permutation(20)]
    expected = []
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    other = shuffled / np.linalg.norm(shuffled, axis=1, keepdims=True)
    for row in range(20):
        near = [i for i in np.argsort(-(unit @ unit[row]), kind="stable") if i != row][:5]
        found = [i for i in np.argsort(-(other @ other[row]), kind="stable") if i != row][:5]
        expected.append(len(set(near) & set(found)) / 5)
    assert neighbour_agreement(vectors, shuffled) == pytest.approx(np.mean(expected))
    assert neighbour_agreement(vectors[:1], vectors[:1]) == 1.0


def _window(documents):
    """Chunks of 50 documents of 3 to 9 tokens, document i's tokens all i."""
    lengths = np.array([3 + i % 7 for i in range(documents)], np.int32)
    ids = np.repeat(np.arange(documents, dtype=np.int32), lengths)
    ends = np.concatenate([[0], np.cumsum(lengths)])
    return [
        SimpleNamespace(
            token_ids=ids[ends[i] : ends[min(i + 50, documents)]], lengths=lengths[i : i + 50]
        )
        for i in range(0, documents, 50)
    ]


def test_static_int8_calibrates_on_the_documents_after_the_check_s():
    calibration = window_calibration(_window(500))
    assert [int(s[0]) for s in calibration.sequences] == list(range(64, 364))
    assert [len(s) for s in calibration.sequences] == [3 + i % 7 for i in range(64, 364)]
    # Fewer than 100 documents after the check's: the window's first 300.
    assert [int(s[0]) for s in window_calibration(_window(150)).sequences] == list(range(150))


def test_the_run_directory_keeps_the_calibration_whole(tmp_path):
    from bulkembed.engine.precision import Agreement, PrecisionCheck

    sequences = (np.array([101, 7, 102], np.int32), np.array([101, 70000, 3, 102], np.int32))
    calibration = int8.Calibration(sequences)
    check = PrecisionCheck("int8", Agreement(0.97, None, 0.9), 64, False, 2048, int8_check.GUARD)
    record = Int8Record(tmp_path / "int8.json")
    record.write(check, calibration)
    found, read = record.read()
    assert read is not None and read.digest == calibration.digest
    assert [s.tolist() for s in read.sequences] == [s.tolist() for s in sequences]
    assert found == {
        "tried": "int8", "documents": 64, "budget": 2048, "dense": 0.97, "others": None,
        "neighbours": 0.9,
    }  # fmt: skip
    assert int8_check.int8_bar(DType.AUTO) == int8_check.NEAR_LOSSLESS
    assert int8_check.int8_bar(DType.INT8) == int8_check.GUARD


def test_texts_embedded_in_process_refuse_int8(tiny_st):
    from bulkembed import api
    from bulkembed.errors import UsageError

    with pytest.raises(UsageError, match=r"^dtype='int8' is checked on a run's corpus: embed "):
        api.load(str(tiny_st("mean")), dtype="int8")


@pytest.mark.slow
def test_shards_of_a_run_take_the_decision_of_the_first_to_make_one(tmp_path, tiny_st, monkeypatch):
    model = tiny_st("mean")
    corpus = write_jsonl(tmp_path / "corpus" / "c.jsonl", records(400))
    common = ("--dtype", "int8", "--records-per-unit", "100", "--max-batch-tokens", "256")
    first = run_cli(corpus, model, tmp_path / "out", *common, "--shard", "0/2")
    assert first.exit_code == 0, first.output
    made = (tmp_path / "out" / "_bulkembed" / "int8.json").read_bytes()
    # The second shard checks on its own first window, as if the first had not decided
    # yet; the first's decision is found as it is kept, and taken.
    reads = []
    read = Int8Record.read

    def late(record):
        reads.append(record.path)
        return None if len(reads) == 1 else read(record)

    monkeypatch.setattr(Int8Record, "read", late)
    second = run_cli(corpus, model, tmp_path / "out", *common, "--shard", "1/2")
    assert second.exit_code == 0, second.output
    assert len(reads) == 2
    assert (tmp_path / "out" / "_bulkembed" / "int8.json").read_bytes() == made
    reference = run_cli(corpus, model, tmp_path / "one", *common)
    assert reference.exit_code == 0, reference.output
    assert _lowest_cosine(read_output(tmp_path / "one"), read_output(tmp_path / "out")) >= 0.9999

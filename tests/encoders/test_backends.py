"""The OpenVINO backend: the same vectors as PyTorch for every family, when it is chosen, and
its export cache (corrupt, other weights, cut short, two processes at once)."""

import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import cosines, embed_texts, mixed_texts, records, run_cli, sample_texts, write_jsonl

from bulkembed.batching.tokenize import TextTokenizer, TokenizerSettings
from bulkembed.config import Backend, RunConfig
from bulkembed.encoders import TokenBatch, build_encoder
from bulkembed.encoders import openvino as ov_backend
from bulkembed.encoders.backend import choose_backend
from bulkembed.errors import ModelError, UsageError
from bulkembed.models.devices import cpu_accelerates_bfloat16
from bulkembed.models.export_cache import MANIFEST, cached, key_digest, problem
from bulkembed.models.model_spec import resolve_model


def _spec(folder: Path, **options):
    return resolve_model(RunConfig(inputs=("x",), output="out", model=str(folder), **options))


def _encode(spec, texts: list[str], dtype: torch.dtype = torch.float32):
    """The encoder of `spec` on the CPU, and its embeddings of `texts` in one batch."""
    encoder = build_encoder(spec, "cpu", dtype)
    tokenizer = TextTokenizer(TokenizerSettings(spec.tokenizer_json, spec.max_length, spec.prompt))
    flat, lengths, _ = tokenizer(texts)
    return encoder, encoder.embed_batch(TokenBatch(flat, lengths))


def _by_backend(folder: Path, texts: list[str], **options):
    """Embeddings of `texts` from PyTorch and from OpenVINO, in float32."""
    found = {}
    for backend in ("torch", "openvino"):
        encoder, found[backend] = _encode(_spec(folder, backend=backend, **options), texts)
        assert encoder.backend is Backend(backend)
    return found["torch"], found["openvino"]


def _lengths_texts() -> list[str]:
    """One-token, typical and past-the-maximum documents in one batch."""
    return ["", "a", *sample_texts(12), "word " * 400, "x " * 62]


@pytest.mark.parametrize("mode", ["cls", "mean"])
def test_openvino_dense_equals_pytorch(tiny_st, mode):
    torch_vectors, ov_vectors = _by_backend(tiny_st(mode), _lengths_texts())
    assert ov_vectors.dense.shape == torch_vectors.dense.shape == (16, 32)
    assert cosines(ov_vectors.dense, torch_vectors.dense).min() >= 0.99999


def test_openvino_bge_m3_equals_pytorch_in_every_output(tiny_bge_m3):
    texts = mixed_texts()
    expected, found = _by_backend(
        tiny_bge_m3, texts, outputs=("dense", "sparse", "multivector"), max_length=64
    )
    assert cosines(found.dense, expected.dense).min() >= 0.99999
    assert sum(len(s.indices) for s in expected.sparse) > 100
    for ours, theirs in zip(found.sparse, expected.sparse, strict=True):
        assert ours.indices.tolist() == theirs.indices.tolist()
        np.testing.assert_allclose(ours.values, theirs.values, atol=1e-5, rtol=0)
    for ours, theirs in zip(found.multivector, expected.multivector, strict=True):
        assert ours.shape == theirs.shape
        if len(ours):
            assert cosines(ours, theirs).min() >= 0.99999


def test_openvino_splade_equals_pytorch(tiny_splade):
    expected, found = _by_backend(tiny_splade, mixed_texts())
    assert sum(len(s.indices) for s in expected.sparse) > 100
    for ours, theirs in zip(found.sparse, expected.sparse, strict=True):
        assert ours.indices.tolist() == theirs.indices.tolist()
        np.testing.assert_allclose(ours.values, theirs.values, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_openvino_in_bfloat16_keeps_parity_with_sentence_transformers(tmp_path, minilm):
    from sentence_transformers import SentenceTransformer

    texts = sample_texts(300)
    table, _ = embed_texts(tmp_path, minilm, texts, "--dtype", "bfloat16", "--backend", "openvino")
    ours = np.array(table.column("dense").to_pylist())
    reference = SentenceTransformer(str(minilm), device="cpu").encode(
        texts, batch_size=32, normalize_embeddings=True
    )
    assert cosines(ours, reference).min() >= 0.9999


def test_auto_takes_openvino_on_a_cpu_for_the_converted_architectures(tiny_st, tiny_bge_m3):
    bert, xlm_roberta = _spec(tiny_st("cls")), _spec(tiny_bge_m3)
    assert bert.model_type == "bert" and xlm_roberta.model_type == "xlm-roberta"
    for spec in (bert, xlm_roberta):
        assert choose_backend(spec, "cpu", torch.float32) is Backend.OPENVINO
        assert choose_backend(spec, "cpu", torch.bfloat16) is Backend.OPENVINO
        assert choose_backend(spec, "cpu", torch.float16) is Backend.TORCH
        assert choose_backend(spec, "cuda:0", torch.float16) is Backend.TORCH
    compiled = _spec(tiny_st("cls"), compile=True)
    assert choose_backend(compiled, "cpu", torch.float32) is Backend.TORCH
    other = _spec(tiny_st("cls"))
    object.__setattr__(other, "model_type", "modernbert")
    assert choose_backend(other, "cpu", torch.float32) is Backend.TORCH
    forced = _spec(tiny_st("cls"), backend="torch")
    assert choose_backend(forced, "cpu", torch.float32) is Backend.TORCH


def test_an_openvino_backend_that_cannot_run_is_a_usage_error(tiny_st):
    spec = _spec(tiny_st("cls"), backend="openvino")
    with pytest.raises(UsageError, match=r"^--backend openvino runs on the CPU, not cuda:0"):
        choose_backend(spec, "cuda:0", torch.float16)
    with pytest.raises(UsageError, match=r"computes in float32 or bfloat16"):
        choose_backend(spec, "cpu", torch.float16)
    with pytest.raises(UsageError, match=r"^--compile and --backend openvino conflict"):
        _spec(tiny_st("cls"), backend="openvino", compile=True)


def test_a_model_openvino_cannot_convert_runs_in_pytorch_with_one_warning(
    tmp_path, tiny_st, monkeypatch
):
    def refuse(load, source, masked_lm, folder):
        raise ModelError(f"OpenVINO cannot convert {source}: unsupported operation")

    monkeypatch.setenv("BULKEMBED_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(ov_backend, "convert", refuse)
    spec = _spec(tiny_st("mean"))
    encoder, found = _encode(spec, sample_texts(5))
    assert encoder.backend is Backend.TORCH and not encoder.autocast
    assert encoder.notices == [
        f"OpenVINO cannot convert {spec.source}: unsupported operation; "
        "running it in PyTorch instead"
    ]
    _, expected = _encode(_spec(tiny_st("mean"), backend="torch"), sample_texts(5))
    np.testing.assert_array_equal(found.dense, expected.dense)
    with pytest.raises(ModelError, match="unsupported operation"):
        _encode(_spec(tiny_st("mean"), backend="openvino"), sample_texts(5))


def test_the_run_warns_when_it_falls_back(tmp_path, tiny_st, monkeypatch):
    def refuse(load, source, masked_lm, folder):
        raise ModelError("OpenVINO cannot convert it: unsupported operation")

    monkeypatch.setenv("BULKEMBED_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(ov_backend, "convert", refuse)
    corpus = write_jsonl(tmp_path / "c.jsonl", records(4))
    result = run_cli(corpus, tiny_st("cls"), tmp_path / "out", "--dtype", "float32")
    assert result.exit_code == 0, result.output
    assert result.output.count("OpenVINO cannot convert") == 1
    assert (
        "warning: OpenVINO cannot convert it: unsupported operation; running it in PyTorch "
        "instead" in result.output
    )


# The export cache.


def _cache_folder(spec, masked_lm: bool = False) -> Path:
    key = ov_backend.conversion_key(spec, "masked-lm" if masked_lm else "base")
    return Path(os.environ["BULKEMBED_CACHE_DIR"]) / "openvino" / key_digest(key)


def _count_conversions(monkeypatch) -> list[str]:
    made: list[str] = []
    convert = ov_backend.convert

    def counted(load, source, masked_lm, folder):
        made.append(source)
        convert(load, source, masked_lm, folder)

    monkeypatch.setattr(ov_backend, "convert", counted)
    return made


def test_a_conversion_is_made_once_then_read_from_the_cache(tiny_st, monkeypatch):
    spec = _spec(tiny_st("lasttoken"))
    made = _count_conversions(monkeypatch)
    _, first = _encode(spec, sample_texts(6))
    folder = _cache_folder(spec)
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["key"]["weights"] == spec.version
    assert sorted(manifest["files"]) == ["model.bin", "model.xml"]
    _, second = _encode(spec, sample_texts(6))
    assert made == [spec.source]
    np.testing.assert_array_equal(first.dense, second.dense)


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        ("flip", "model.bin does not match its checksum"),
        ("truncate", "model.bin holds"),
        ("no-manifest", "no manifest (a conversion that did not finish)"),
        ("other-weights", "made for another weights"),
    ],
)
def test_a_damaged_cache_is_detected_and_rebuilt(tiny_bge_m3, monkeypatch, damage, reason):
    spec = _spec(tiny_bge_m3, outputs=("dense",))
    texts = sample_texts(6)
    _, expected = _encode(spec, texts)
    folder = _cache_folder(spec)
    weights = folder / "model.bin"
    if damage == "flip":
        data = bytearray(weights.read_bytes())
        data[len(data) // 2] ^= 0xFF
        weights.write_bytes(bytes(data))
    elif damage == "truncate":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif damage == "no-manifest":
        (folder / MANIFEST).unlink()
    else:
        manifest = json.loads((folder / MANIFEST).read_text())
        manifest["key"]["weights"] = "sha256:0000000000000000"
        (folder / MANIFEST).write_text(json.dumps(manifest))
    made = _count_conversions(monkeypatch)
    encoder, found = _encode(spec, texts)
    assert made == [spec.source]
    assert len(encoder.notices) == 1 and reason in encoder.notices[0]
    assert problem(folder, ov_backend.conversion_key(spec, "base")) is None
    np.testing.assert_array_equal(found.dense, expected.dense)
    assert sorted(p.name for p in folder.parent.iterdir() if p.name.startswith(".")) == []


def test_a_build_left_by_a_dead_process_is_cleared(tmp_path, monkeypatch):
    monkeypatch.setenv("BULKEMBED_CACHE_DIR", str(tmp_path))
    key = {"weights": "w"}
    dead = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(0,))
    dead.start()
    dead.join()
    import socket

    parent = tmp_path / "kind"
    left = parent / f".building-{key_digest(key)}-{socket.gethostname()}-{dead.pid}-0abc"
    left.mkdir(parents=True)
    (left / "model.bin").write_bytes(b"half")
    alive = parent / f".building-{key_digest(key)}-{socket.gethostname()}-{os.getpid()}-0abd"
    alive.mkdir()
    folder = cached("kind", key, lambda into: (into / "f").write_text("x"))
    assert (folder / "f").read_text() == "x"
    assert not left.exists() and alive.exists()


def _build_slowly(into: Path) -> None:
    """A conversion that takes a while and writes 4 MB: long enough for two to overlap."""
    rng = np.random.default_rng(0)
    (into / "model.bin").write_bytes(rng.bytes(1 << 22))
    time.sleep(0.5)
    (into / "model.xml").write_text(f"<net pid='{os.getpid()}'/>")


def _convert_at(cache: str, start: float, key: dict) -> str:
    os.environ["BULKEMBED_CACHE_DIR"] = cache
    time.sleep(max(0.0, start - time.time()))
    folder = cached("kind", key, _build_slowly)
    return (folder / "model.xml").read_text()


def test_two_processes_converting_at_once_leave_one_valid_folder(tmp_path):
    key = {"weights": "sha256:1234", "bulkembed": "test"}
    start = time.time() + 3
    context = multiprocessing.get_context("spawn")
    with context.Pool(2) as pool:
        found = pool.starmap(_convert_at, [(str(tmp_path), start, key)] * 2)
    # Both built (neither saw the other's folder at the start), one rename won, and both
    # use the winner's files.
    assert found[0] == found[1]
    folder = tmp_path / "kind" / key_digest(key)
    assert problem(folder, key) is None
    assert [p.name for p in (tmp_path / "kind").iterdir()] == [folder.name]


def test_two_runs_converting_the_same_model_at_once_both_embed(tmp_path, tiny_st):
    import subprocess
    import sys

    folder = tiny_st("mean")
    script = (
        "import sys, time, json, numpy as np\n"
        "from bulkembed.config import RunConfig\n"
        "from bulkembed.models.model_spec import resolve_model\n"
        "from bulkembed.encoders import build_encoder, TokenBatch\n"
        "import torch\n"
        f"spec = resolve_model(RunConfig(inputs=('x',), output='o', model={str(folder)!r}))\n"
        "time.sleep(max(0.0, float(sys.argv[1]) - time.time()))\n"
        "encoder = build_encoder(spec, 'cpu', torch.float32)\n"
        "batch = TokenBatch(np.arange(1, 11, dtype=np.int32), np.array([4, 6], dtype=np.int32))\n"
        "print(json.dumps(encoder.embed_batch(batch).dense.tolist()))\n"
    )
    env = {**os.environ, "BULKEMBED_CACHE_DIR": str(tmp_path)}
    start = str(time.time() + 12)
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", script, start], env=env, stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outputs = [json.loads(run.communicate(timeout=240)[0]) for run in runs]
    assert [run.returncode for run in runs] == [0, 0]
    np.testing.assert_array_equal(outputs[0], outputs[1])
    (converted,) = (tmp_path / "openvino").iterdir()
    spec = _spec(folder)
    assert problem(converted, ov_backend.conversion_key(spec, "base")) is None


def test_a_batch_not_finite_in_bfloat16_runs_again_in_float32_through_openvino(
    tiny_st, monkeypatch
):
    spec = _spec(tiny_st("cls"), backend="openvino")
    _, expected = _encode(spec, sample_texts(5))
    call = ov_backend.OpenVINOModel.__call__

    def overflow_in_bfloat16(self, input_ids, attention_mask):
        out = call(self, input_ids, attention_mask)
        if self.dtype == torch.bfloat16:
            out.last_hidden_state[0, 0, 0] = float("inf")
        return out

    monkeypatch.setattr(ov_backend.OpenVINOModel, "__call__", overflow_in_bfloat16)
    encoder, _ = _encode(spec, sample_texts(5), torch.bfloat16)
    assert encoder.backend is Backend.OPENVINO
    tokenizer = TextTokenizer(TokenizerSettings(spec.tokenizer_json, spec.max_length, spec.prompt))
    flat, lengths, _ = tokenizer(sample_texts(5))
    again = encoder.embed_within_memory(TokenBatch(flat, lengths))
    assert np.isfinite(again.dense).all()
    assert cosines(again.dense, expected.dense).min() >= 0.99999


@pytest.mark.parametrize(("option", "ran"), [(None, "openvino"), ("torch", "torch")])
def test_the_summary_names_the_backend_that_ran(tmp_path, tiny_st, option, ran):
    extra = () if option is None else ("--backend", option)
    _, out = embed_texts(tmp_path, tiny_st("cls"), sample_texts(3), "--dtype", "float32", *extra)
    summary = json.loads((out / "_bulkembed" / "summary.json").read_text())
    assert summary["backend"] == ran


def test_the_bfloat16_twin_of_the_check_compiles_the_same_graph(tiny_st):
    spec = _spec(tiny_st("mean"))
    texts = sample_texts(20)
    full, a = _encode(spec, texts)
    half, b = _encode(spec, texts, torch.bfloat16)
    assert full.backend is half.backend is Backend.OPENVINO
    assert not full.autocast and not half.autocast
    if cpu_accelerates_bfloat16():
        assert not np.array_equal(a.dense, b.dense)  # the multiplies ran in bfloat16
    assert cosines(a.dense, b.dense).min() >= 0.999
    twin = full.in_dtype(torch.bfloat16)
    assert twin.model.graph is full.model.graph and twin.model.dtype == torch.bfloat16
    tokenizer = TextTokenizer(TokenizerSettings(spec.tokenizer_json, spec.max_length, spec.prompt))
    flat, lengths, _ = tokenizer(texts)
    np.testing.assert_array_equal(twin.embed_batch(TokenBatch(flat, lengths)).dense, b.dense)


# An export cache that cannot be written only costs the conversion's time.


def _unwritable_cache(tmp_path: Path, monkeypatch) -> Path:
    """A cache folder under a regular file, and temporary folders under `tmp_path/tmp`."""
    (tmp_path / "file").write_text("a file, not a folder")
    monkeypatch.setenv("BULKEMBED_CACHE_DIR", str(tmp_path / "file" / "cache"))
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(temporary))
    return temporary


def test_a_cache_under_a_file_converts_in_a_temporary_folder_with_one_warning(
    tmp_path, tiny_st, monkeypatch
):
    temporary = _unwritable_cache(tmp_path, monkeypatch)
    corpus = write_jsonl(tmp_path / "c.jsonl", records(4))
    result = run_cli(corpus, tiny_st("cls"), tmp_path / "out", "--dtype", "float32")
    assert result.exit_code == 0, result.output
    warning = (
        f"warning: the export cache {tmp_path / 'file' / 'cache'} cannot be written ([Errno 20] "
        f"Not a directory: '{tmp_path / 'file' / 'cache' / 'openvino'}'): converting "
        f"{tiny_st('cls')} in a "
        "temporary folder for this run (set BULKEMBED_CACHE_DIR to a writable folder to "
        "convert it once)"
    )
    assert [line for line in result.output.splitlines() if "warning" in line] == [warning]
    summary = json.loads((tmp_path / "out" / "_bulkembed" / "summary.json").read_text())
    assert summary["backend"] == "openvino"
    assert list(temporary.iterdir()) == []


def test_a_full_disk_under_the_cache_converts_elsewhere_or_runs_in_pytorch(
    tmp_path, tiny_st, monkeypatch
):
    import openvino

    save = openvino.save_model
    cache = tmp_path / "cache"
    monkeypatch.setenv("BULKEMBED_CACHE_DIR", str(cache))

    def full_under_cache(model, path, **options):
        if str(path).startswith(str(cache)):
            raise RuntimeError("Exception from src/core/src/pass/serialize.cpp: basic_ios::clear")
        save(model, path, **options)

    monkeypatch.setattr(openvino, "save_model", full_under_cache)
    spec = _spec(tiny_st("mean"))
    encoder, found = _encode(spec, sample_texts(5))
    assert encoder.backend is Backend.OPENVINO
    assert len(encoder.notices) == 1 and "cannot be written" in encoder.notices[0]
    assert "basic_ios::clear" in encoder.notices[0]
    _, expected = _encode(_spec(tiny_st("mean"), backend="torch"), sample_texts(5))
    assert cosines(found.dense, expected.dense).min() > 0.9999

    def full(model, path, **options):
        raise RuntimeError("basic_ios::clear")

    monkeypatch.setattr(openvino, "save_model", full)
    encoder, found = _encode(spec, sample_texts(5))
    assert encoder.backend is Backend.TORCH
    assert encoder.notices[-1] == (
        f"OpenVINO cannot convert {spec.source}: basic_ios::clear; running it in PyTorch instead"
    )
    np.testing.assert_array_equal(found.dense, expected.dense)


def test_embed_with_an_unwritable_cache_prints_its_vector(tmp_path, tiny_st, monkeypatch):
    from typer.testing import CliRunner

    from bulkembed.cli import app

    _unwritable_cache(tmp_path, monkeypatch)
    result = CliRunner().invoke(app, ["embed", "hello", "--model", str(tiny_st("mean"))])
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.stdout.splitlines()[-1])["dense"]) == 32
    assert "cannot be written" in result.stderr


def test_a_conversion_that_fails_for_another_reason_is_not_blamed_on_the_cache(
    tmp_path, tiny_st, monkeypatch
):
    import errno

    made = []

    def unreachable(load, source, masked_lm, folder):
        made.append(folder)
        raise OSError(errno.ECONNREFUSED, "Connection refused")

    monkeypatch.setenv("BULKEMBED_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(ov_backend, "convert", unreachable)
    spec = _spec(tiny_st("mean"))
    encoder, _ = _encode(spec, sample_texts(3))
    assert encoder.backend is Backend.TORCH and len(made) == 1
    assert encoder.notices == [
        f"OpenVINO cannot convert {spec.source}: [Errno 111] Connection refused; running it "
        "in PyTorch instead"
    ]


def _without_ci(home):
    """This environment with `home` as the home folder, and none of the variables by which
    OpenVINO tells a CI job (where it declines its telemetry by itself)."""
    environment = {
        k: v for k, v in os.environ.items() if k not in ("CI", "TF_BUILD", "JENKINS_URL")
    }
    return {**environment, "HOME": str(home), "HF_HUB_OFFLINE": "1"}


def test_a_run_on_openvino_sends_no_telemetry_and_writes_nothing_home(tmp_path, tiny_st):
    home = tmp_path / "home"
    home.mkdir()
    write_jsonl(
        tmp_path / "c.jsonl", [{"id": f"d{i}", "text": t} for i, t in enumerate(sample_texts(20))]
    )
    arguments = ["run", str(tmp_path / "c.jsonl"), "--model", str(tiny_st("mean"))]
    arguments += ["--output", str(tmp_path / "out"), "--backend", "openvino", "--quiet"]
    script = (
        "import sys, threading; from bulkembed.cli import app\n"
        "try:\n    app(sys.argv[1:], prog_name='bulkembed')\nexcept SystemExit as e:\n"
        "    assert not e.code, e.code\n"
        "assert sys.modules.get('openvino_telemetry') is None\n"
        "assert 'openvino' in sys.modules\n"
        "print(sorted(t.name for t in threading.enumerate()))\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", script, *arguments],
        env=_without_ci(home),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "['MainThread']"
    assert list(home.iterdir()) == []


def test_openvino_telemetry_is_openvinos_to_decide_when_asked_for(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    script = "from bulkembed.encoders.openvino_import import import_openvino; import_openvino()"
    environment = {**_without_ci(home), "BULKEMBED_OPENVINO_TELEMETRY": "1"}
    subprocess.run([sys.executable, "-c", script], env=environment, check=True, timeout=120)
    # OpenVINO's own choice: its client id, written where it writes it.
    assert (home / "intel" / "openvino_ga_cid").exists()

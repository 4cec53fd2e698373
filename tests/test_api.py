"""The in-process encoder (`bulkembed.load`) and `bulkembed embed`, against `bulkembed run`."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from helpers import (
    ROOT,
    cosines,
    embed_texts,
    mixed_texts,
    records,
    run_cli,
    sample_texts,
    write_jsonl,
)
from typer.testing import CliRunner

import bulkembed
from bulkembed.cli import app
from bulkembed.config import RunConfig
from bulkembed.errors import BulkembedError

runner = CliRunner()
# The run's settings that make a CPU compute as a reference does: float32, small batches.
RUN_OPTIONS = ("--dtype", "float32", "--max-batch-tokens", "512")


def _load(model, **settings):
    return bulkembed.load(model, dtype="float32", max_batch_tokens=512, **settings)


def _sparse_rows(table) -> list[dict]:
    return table.column("sparse").to_pylist()


@pytest.mark.parametrize("mode", ["cls", "mean"])
def test_embed_documents_equals_the_run_output_dense(tmp_path, tiny_st, mode):
    texts = mixed_texts()
    table, _ = embed_texts(tmp_path, tiny_st(mode), texts, *RUN_OPTIONS)
    found = _load(tiny_st(mode)).encode_document(texts)
    expected = np.array(table.column("dense").to_pylist(), dtype=np.float32)
    assert found.dense.shape == expected.shape == (len(texts), 32)
    assert found.dense.dtype == np.float32
    assert cosines(found.dense, expected).min() >= 0.99999
    assert found.sparse is None and found.multivector is None


def test_embed_documents_equals_the_run_output_bge_m3(tmp_path, tiny_bge_m3):
    texts = mixed_texts()
    outputs = "dense,sparse,multivector"
    table, _ = embed_texts(tmp_path, tiny_bge_m3, texts, *RUN_OPTIONS, "--outputs", outputs)
    found = _load(tiny_bge_m3, outputs=outputs).encode_document(texts)

    expected = np.array(table.column("dense").to_pylist(), dtype=np.float32)
    assert cosines(found.dense, expected).min() >= 0.99999
    assert len(found.sparse) == len(texts)
    for vector, row in zip(found.sparse, _sparse_rows(table), strict=True):
        assert vector.indices.dtype == np.int32 and vector.values.dtype == np.float32
        assert vector.indices.tolist() == row["indices"]
        assert list(vector.indices) == sorted(vector.indices)
        np.testing.assert_allclose(vector.values, row["values"], atol=1e-5)
    for vectors, row in zip(
        found.multivector, table.column("multivector").to_pylist(), strict=True
    ):
        row = np.array(row, dtype=np.float32)
        assert vectors.shape == row.shape
        assert cosines(vectors, row).min() >= 0.99999


def test_embed_documents_equals_the_run_output_splade(tmp_path, tiny_splade):
    texts = mixed_texts()
    table, _ = embed_texts(tmp_path, tiny_splade, texts, *RUN_OPTIONS)
    found = _load(tiny_splade).encode_document(texts)
    assert found.dense is None and found.multivector is None
    nonempty = 0
    for vector, row in zip(found.sparse, _sparse_rows(table), strict=True):
        assert vector.indices.tolist() == row["indices"]
        np.testing.assert_allclose(vector.values, row["values"], atol=1e-5)
        nonempty += len(row["indices"]) > 0
    assert nonempty > 20


def test_embed_query_applies_the_recipe_query_prompt(tiny_st):
    model = tiny_st("mean")
    texts = ["how do I sort a list", "what is a generator?", "open a file"]
    encoder = _load(model, recipe="e5-base-v2", max_length=64)
    assert (encoder.query_prompt, encoder.document_prompt) == ("query: ", "passage: ")
    plain = _load(model, recipe="e5-base-v2", max_length=64, prompt="")

    queries = encoder.encode_query(texts).dense
    np.testing.assert_allclose(
        queries, plain.encode([f"query: {t}" for t in texts]).dense, atol=1e-6
    )
    documents = encoder.encode_document(texts).dense
    np.testing.assert_allclose(
        documents, plain.encode([f"passage: {t}" for t in texts]).dense, atol=1e-6
    )
    # `embed` applies what the settings say: the recipe's corpus prompt, as `run` does.
    np.testing.assert_allclose(encoder.encode(texts).dense, documents, atol=1e-6)
    # The prompts change the vectors: the test could fail.
    assert cosines(queries, plain.encode(texts).dense).max() < 0.9999


def test_a_model_without_a_query_prompt_embeds_queries_as_they_are(tiny_st):
    encoder = _load(tiny_st("mean"))
    assert encoder.query_prompt == ""
    np.testing.assert_array_equal(
        encoder.encode_query(["a query"]).dense, encoder.encode(["a query"]).dense
    )


def test_dim_and_normalization_as_the_run_writes_them(tmp_path, tiny_bert):
    texts = mixed_texts()
    raw = _load(tiny_bert, pooling="mean", normalize=False).encode(texts).dense
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0)

    normalized = _load(tiny_bert, pooling="mean", normalize=True).encode(texts).dense
    np.testing.assert_allclose(
        normalized, raw / np.linalg.norm(raw, axis=1, keepdims=True), atol=1e-6
    )

    encoder = _load(tiny_bert, pooling="mean", normalize=True, dim=16)
    cut = encoder.encode(texts).dense
    assert cut.shape == (len(texts), 16) and encoder.dim == 16
    head = raw[:, :16]
    np.testing.assert_allclose(cut, head / np.linalg.norm(head, axis=1, keepdims=True), atol=1e-6)

    table, _ = embed_texts(
        tmp_path, tiny_bert, texts, *RUN_OPTIONS, "--pooling", "mean", "--normalize", "--dim", "16"
    )
    assert cosines(cut, np.array(table.column("dense").to_pylist())).min() >= 0.99999


def test_one_text_empty_lists_and_order(tiny_st):
    encoder = _load(tiny_st("cls"))
    texts = ["a much longer text about the python standard library " * 5, "short", "mid text"]
    together = encoder.encode(texts).dense
    one_by_one = np.vstack([encoder.encode(t).dense for t in texts])
    assert together.shape == (3, 32)
    np.testing.assert_allclose(together, one_by_one, atol=1e-6)
    empty = encoder.encode([])
    assert empty.dense.shape == (0, 32) and empty.dense.dtype == np.float32


def test_empty_calls_give_each_output_with_no_row(tiny_bge_m3):
    empty = _load(tiny_bge_m3, outputs="dense,sparse,multivector").encode_query([])
    assert empty.dense.shape == (0, 32)
    assert len(empty.sparse) == 0 and list(empty.sparse) == [] and empty.multivector == []


def test_bad_arguments_are_one_line_errors(tiny_st):
    with pytest.raises(BulkembedError, match=r"load: unknown setting output"):
        bulkembed.load(tiny_st("cls"), output="x")
    with pytest.raises(BulkembedError, match="--pooling: choose one of cls, mean, last-token"):
        bulkembed.load(tiny_st("cls"), pooling="max")
    encoder = _load(tiny_st("cls"))
    with pytest.raises(BulkembedError, match="text 1 is a int, not a string: pass strings only"):
        encoder.encode(["fine", 3])


def test_import_and_embed_help_do_not_load_torch():
    code = (
        "import sys, bulkembed\n"
        "bulkembed.TextEncoder, bulkembed.Embeddings, bulkembed.SparseVector\n"
        "from bulkembed.cli import main\n"
        "sys.argv = ['bulkembed', 'embed', '--help']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print('HEAVY:', sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    environment = {**_env(), "COLUMNS": "200"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=environment
    )
    assert "--query" in result.stdout
    assert "HEAVY: []" in result.stdout


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


_LOAD_SCRIPT = """\
import numpy as np
import bulkembed

texts = [f"text number {{i}} about python" for i in range(100)]
encoder = bulkembed.load({model!r}, dtype="float32")
found = encoder.encode_document(texts)
assert found.dense.shape == (100, 32), found.dense.shape
np.save({out!r}, found.dense)
print("embedded", len(found.dense))
"""


@pytest.mark.slow
def test_a_script_without_a_main_guard_loads_and_embeds(tmp_path, tiny_st):
    script = tmp_path / "unguarded.py"
    script.write_text(_LOAD_SCRIPT.format(model=str(tiny_st("mean")), out=str(tmp_path / "a.npy")))
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=_env(), timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert "embedded 100" in result.stdout
    expected = _load(tiny_st("mean")).encode_document(
        [f"text number {i} about python" for i in range(100)]
    )
    np.testing.assert_allclose(np.load(tmp_path / "a.npy"), expected.dense, atol=1e-6)


@pytest.mark.slow
def test_a_script_from_stdin_loads_and_embeds(tmp_path, tiny_st):
    source = _LOAD_SCRIPT.format(model=str(tiny_st("mean")), out=str(tmp_path / "b.npy"))
    result = subprocess.run(
        [sys.executable, "-"],
        input=source,
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "embedded 100" in result.stdout


_CORPUS_SCRIPT = """\
import bulkembed
from bulkembed.config import RunConfig

summary = bulkembed.embed_corpus(
    RunConfig(inputs={corpus!r}, output={out!r}, model={model!r}, tokenize_workers=2,
              dtype="float32", records_per_unit=40)
)
print("docs", summary.docs)
"""


@pytest.mark.slow
@pytest.mark.parametrize("stdin", [False, True], ids=["file", "stdin"])
def test_embed_corpus_without_a_main_guard_tokenizes_in_process(tmp_path, tiny_st, stdin):
    corpus = write_jsonl(tmp_path / "c.jsonl", records(150))
    out = tmp_path / "out"
    source = _CORPUS_SCRIPT.format(corpus=str(corpus), out=str(out), model=str(tiny_st("mean")))
    script = tmp_path / "unguarded.py"
    script.write_text(source)
    command = [sys.executable, "-"] if stdin else [sys.executable, str(script)]
    result = subprocess.run(
        command,
        input=source if stdin else None,
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "tokenizing in this process, not in 2 tokenizer processes" in result.stderr
    ids = pq.read_table(out).column("id").to_pylist()
    assert sorted(ids) == sorted(f"doc-{i}" for i in range(150))


@pytest.mark.slow
def test_a_guarded_script_keeps_its_tokenizer_processes(tmp_path, tiny_st):
    corpus = write_jsonl(tmp_path / "c.jsonl", records(60))
    out = tmp_path / "out"
    body = _CORPUS_SCRIPT.format(corpus=str(corpus), out=str(out), model=str(tiny_st("mean")))
    guarded = "def main():\n" + "".join(f"    {line}\n" for line in body.splitlines())
    script = tmp_path / "guarded.py"
    script.write_text(guarded + 'if __name__ == "__main__":\n    main()\n')
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=_env(), timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert "tokenizing in this process" not in result.stderr
    assert "docs 60" in result.stdout


def test_several_devices_from_an_unguarded_script_are_refused(tmp_path, tiny_st):
    script = tmp_path / "devices.py"
    script.write_text(
        "import bulkembed\n"
        f"bulkembed.load({str(tiny_st('mean'))!r}, devices='cpu,cpu', dtype='float32')\n"
    )
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=_env(), timeout=300
    )
    assert result.returncode != 0
    assert (
        "cannot start encoder processes: devices.py calls bulkembed outside an "
        '`if __name__ == "__main__":` block, which a worker process would run again; put the '
        'call under `if __name__ == "__main__":` in a script file'
    ) in result.stderr


_FLOAT = re.compile(r"-?\d+(?:\.\d+)?(?:e[+-]?\d+)?")


def test_embed_command_prints_one_json_line_per_text(tiny_bge_m3):
    texts = ["the first text", "a second, longer text about python"]
    arguments = ["embed", *texts, "--model", str(tiny_bge_m3), *RUN_OPTIONS]
    result = runner.invoke(app, [*arguments, "--outputs", "dense,sparse,multivector"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 2
    expected = _load(tiny_bge_m3, outputs="dense,sparse,multivector").encode(texts)
    for number, line in enumerate(lines):
        row = json.loads(line)
        assert sorted(row) == ["dense", "multivector", "sparse"]
        np.testing.assert_array_equal(np.float32(row["dense"]), expected.dense[number])
        sparse = expected.sparse[number]
        assert row["sparse"]["indices"] == sparse.indices.tolist()
        np.testing.assert_array_equal(np.float32(row["sparse"]["values"]), sparse.values)
        np.testing.assert_array_equal(np.float32(row["multivector"]), expected.multivector[number])
        # Each number is the shortest text that reads back as its float32.
        dense_text = line[line.index('"dense":[') + 9 : line.index("]")]
        for token in dense_text.split(","):
            assert _FLOAT.fullmatch(token)
            assert token == str(np.float32(token))


def test_embed_command_query_applies_the_query_prompt(tiny_st):
    model = str(tiny_st("mean"))
    base = ["embed", "how to sort", "--model", model, "--recipe", "e5-base-v2"]
    base += ["--max-length", "64", *RUN_OPTIONS]
    query = runner.invoke(app, [*base, "--query"])
    assert query.exit_code == 0, query.output
    expected = _load(model, recipe="e5-base-v2", max_length=64, prompt="").encode(
        "query: how to sort"
    )
    np.testing.assert_array_equal(np.float32(json.loads(query.stdout)["dense"]), expected.dense[0])

    both = runner.invoke(app, [*base, "--query", "--prompt", "x: "])
    assert both.exit_code != 0
    assert "--query applies the model's query prompt: leave out --prompt" in both.stderr


def test_embed_command_writes_npy(tmp_path, tiny_st):
    model = str(tiny_st("cls"))
    target = tmp_path / "vectors.npy"
    arguments = ["embed", "one", "two", "three", "--model", model, *RUN_OPTIONS]
    result = runner.invoke(app, [*arguments, "--format", "npy", "--output", str(target)])
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    np.testing.assert_array_equal(
        np.load(target), _load(model).encode(["one", "two", "three"]).dense
    )

    kept = tmp_path / "mine.npy"
    kept.write_bytes(b"not bulkembed's")
    refused = runner.invoke(app, [*arguments, "--format", "npy", "--output", str(kept)])
    assert refused.exit_code != 0
    assert f"{kept} exists: pass --overwrite to replace it" in refused.stderr
    assert kept.read_bytes() == b"not bulkembed's"

    missing = runner.invoke(app, [*arguments, "--format", "npy"])
    assert missing.exit_code != 0
    assert "--format npy writes a file: pass --output FILE.npy" in missing.stderr


def test_quantize_with_the_default_dtype_out_is_no_conflict(tmp_path, tiny_st):
    config = RunConfig(
        inputs=("c.jsonl",), output="out", model="m", dtype_out="float32", quantize="int8"
    )
    assert config.model.quantize.value == "int8"
    corpus = write_jsonl(tmp_path / "c.jsonl", records(10))
    ok = run_cli(
        corpus, tiny_st("cls"), tmp_path / "a", "--dtype-out", "float32", "--quantize", "int8"
    )
    assert ok.exit_code == 0, ok.output
    assert (
        pq.read_schema(next((tmp_path / "a").glob("*.parquet")))
        .field("dense")
        .type.value_type.bit_width
        == 8
    )


def test_quantize_with_float16_out_is_a_conflict(tmp_path, tiny_st):
    with pytest.raises(BulkembedError, match="--quantize int8 and --dtype-out float16 conflict"):
        RunConfig(
            inputs=("c.jsonl",), output="out", model="m", dtype_out="float16", quantize="int8"
        )
    corpus = write_jsonl(tmp_path / "c.jsonl", records(10))
    result = run_cli(
        corpus, tiny_st("cls"), tmp_path / "a", "--dtype-out", "float16", "--quantize", "int8"
    )
    assert result.exit_code != 0
    assert (
        "error: --quantize int8 and --dtype-out float16 conflict: quantized vectors are "
        "integers; pass one of them"
    ) in result.stderr
    assert not Path(tmp_path / "a").exists()


def test_auto_dtype_is_checked_on_the_first_call(monkeypatch, capsys, tiny_st):
    from bulkembed.engine import precision
    from bulkembed.models import devices

    monkeypatch.setattr(devices, "cpu_accelerates_bfloat16", lambda: True)
    monkeypatch.setattr(precision, "PARITY_THRESHOLD", 1.5)  # no dtype can pass
    texts = mixed_texts()
    encoder = bulkembed.load(tiny_st("mean"), max_batch_tokens=512)
    assert encoder.dtype == "bfloat16"
    found = encoder.encode(texts)
    assert encoder.dtype == "float32"
    assert f"--dtype auto: bfloat16 against float32 on {len(texts)} documents" in (
        capsys.readouterr().err
    )
    reference = _load(tiny_st("mean")).encode(texts)
    np.testing.assert_allclose(found.dense, reference.dense, atol=1e-6)
    encoder.encode(texts[:3])
    assert "--dtype auto" not in capsys.readouterr().err


def test_colbert_documents_embed_and_queries_are_refused(tmp_path, tiny_colbert):
    texts = mixed_texts()[:10]
    table, _ = embed_texts(tmp_path, tiny_colbert, texts, *RUN_OPTIONS)
    encoder = _load(tiny_colbert)
    found = encoder.encode_document(texts)
    for vectors, row in zip(
        found.multivector, table.column("multivector").to_pylist(), strict=True
    ):
        assert vectors.shape == (len(row), 16)
        assert cosines(vectors, np.array(row)).min() >= 0.99999
    with pytest.raises(BulkembedError, match="encode_query: ColBERT queries take their own marker"):
        encoder.encode_query(texts)


@pytest.mark.parametrize(
    ("setting", "option"),
    [
        ({"quantize": "ubinary"}, "--quantize=ubinary"),
        ({"dtype_out": "float16"}, "--dtype-out=float16"),
    ],
)
def test_written_types_as_the_run_writes_them(tmp_path, tiny_st, setting, option):
    texts = mixed_texts()
    table, _ = embed_texts(tmp_path, tiny_st("mean"), texts, *RUN_OPTIONS, option)
    found = _load(tiny_st("mean"), **setting).encode_document(texts)
    expected = table.column("dense").combine_chunks().flatten().to_numpy()
    assert found.dense.dtype == expected.dtype
    # The same texts in the same batches: the same numbers.
    np.testing.assert_array_equal(found.dense, expected.reshape(len(texts), -1))


def test_texts_that_are_not_valid_unicode_are_usage_errors(tiny_st):
    model = str(tiny_st("mean"))
    from_bytes = os.fsdecode(b"\xff\xfe")  # what Python makes of such a command-line argument
    result = runner.invoke(app, ["embed", "fine", from_bytes, "--model", model, *RUN_OPTIONS])
    assert result.exit_code == 2
    assert (
        result.stderr == "error: TEXT 2 is not valid UTF-8 (byte 0xff at byte 0): pass UTF-8 text\n"
    )
    with pytest.raises(BulkembedError) as raised:
        _load(model).encode(["fine", "ab\ud800"])
    assert raised.value.exit_code == 2
    assert str(raised.value) == (
        "text 1 holds an unpaired surrogate (U+D800) at character 2, which is not valid "
        "Unicode: pass valid text"
    )


def test_embed_output_is_a_file_in_a_folder_that_exists_or_stdout(tmp_path, tiny_st):
    arguments = ["embed", "one", "two", "--model", str(tiny_st("cls")), *RUN_OPTIONS]
    missing = runner.invoke(app, [*arguments, "--output", str(tmp_path / "no" / "v.jsonl")])
    assert (missing.exit_code, missing.stderr) == (
        1,
        f"error: --output {tmp_path / 'no' / 'v.jsonl'}: the folder {tmp_path / 'no'} does not "
        "exist; create it\n",
    )
    folder = runner.invoke(app, [*arguments, "--output", str(tmp_path)])
    assert (folder.exit_code, folder.stderr) == (
        1,
        f"error: --output {tmp_path} is a directory: name a file in it\n",
    )
    dash = runner.invoke(app, [*arguments, "--output", "-"], catch_exceptions=False)
    assert dash.exit_code == 0, dash.output
    assert [sorted(json.loads(line)) for line in dash.stdout.splitlines()] == [["dense"]] * 2
    assert not Path("-").exists()
    npy = runner.invoke(app, [*arguments, "--format", "npy", "--output", "-"])
    assert npy.exit_code == 0, npy.output
    import io

    np.testing.assert_array_equal(
        np.load(io.BytesIO(npy.stdout_bytes)), _load(tiny_st("cls")).encode(["one", "two"]).dense
    )


def test_the_encoder_is_a_langchain_embedding_model(tiny_st):
    from langchain_core.documents import Document
    from langchain_core.vectorstores import InMemoryVectorStore

    encoder = _load(tiny_st("mean"))
    texts = sample_texts(40)
    documents = encoder.embed_documents(texts)
    assert isinstance(documents, list) and isinstance(documents[0], list)
    assert isinstance(documents[0][0], float) and len(documents) == len(texts)
    np.testing.assert_array_equal(np.array(documents), encoder.encode_document(texts).dense)
    query = encoder.embed_query(texts[7])
    assert isinstance(query, list) and isinstance(query[0], float)
    np.testing.assert_array_equal(np.array(query), encoder.encode_query([texts[7]]).dense[0])

    store = InMemoryVectorStore(embedding=encoder)
    store.add_documents([Document(page_content=t, id=f"t{i}") for i, t in enumerate(texts)])
    (top,) = store.similarity_search(texts[7], k=1)
    assert top.id == "t7" and top.page_content == texts[7]


def test_langchain_calls_on_a_model_without_dense_output_name_the_encode_call(tiny_splade):
    encoder = _load(tiny_splade)
    with pytest.raises(BulkembedError) as refused:
        encoder.embed_documents(["one text"])
    assert str(refused.value) == (
        "embed_documents returns dense vectors, and this encoder gives sparse: call "
        "encode_document for them"
    )
    with pytest.raises(BulkembedError, match="call encode_query for them"):
        encoder.embed_query("one text")

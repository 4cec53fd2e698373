"""`bulkembed.load(OUTPUT)` and `bulkembed embed --like OUTPUT`: the encoder an output was
made with, every setting that shapes a vector read from it."""

import json
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest
from helpers import ROOT, records, run_cli, write_parquet
from typer.testing import CliRunner

import bulkembed
from bulkembed.cli import app
from bulkembed.errors import ModelError, OutputError, UsageError

QUERY = "how do I sort a list?"


@pytest.fixture
def corpus(tmp_path):
    write_parquet(tmp_path / "corpus" / "a.parquet", records(40), row_group_size=20)
    return tmp_path / "corpus"


def _run(corpus, model, out, *extra):
    result = run_cli(corpus, model, out, *extra)
    assert result.exit_code == 0, result.output
    return out


@pytest.mark.parametrize(
    ("options", "settings"),
    [
        ((), {}),
        (("--dim", "16"), {"dim": 16}),
        (("--dtype-out", "float16"), {"dtype_out": "float16"}),
    ],
    ids=["plain", "dim", "float16"],
)
def test_a_parquet_output_gives_its_encoder(tmp_path, corpus, tiny_st, options, settings):
    model = tiny_st("mean")
    out = _run(corpus, model, tmp_path / "out", *options)
    with bulkembed.load(out) as made, bulkembed.load(model, **settings) as named:
        assert made.embed_query(QUERY) == named.embed_query(QUERY)
        assert made.dim == named.dim == (16 if "dim" in settings else 32)
        # The documents embed as the run wrote them.
        table = pq.read_table(out)
        texts = [r["text"] for r in records(40)][:5]
        np.testing.assert_array_equal(
            made.encode(texts).dense, np.array(table.column("dense").to_pylist()[:5])
        )


def test_a_bge_m3_output_gives_its_encoder_dense_and_sparse(tmp_path, corpus, tiny_bge_m3):
    # A family that pools and normalizes in its own way records neither setting.
    out = _run(corpus, tiny_bge_m3, tmp_path / "out", "--recipe", "bge-m3")
    with bulkembed.load(out) as made, bulkembed.load(tiny_bge_m3, recipe="bge-m3") as named:
        assert made.embed_query(QUERY) == named.embed_query(QUERY)
        found, expected = (
            made.encode_query([QUERY]).sparse[0],
            named.encode_query([QUERY]).sparse[0],
        )
        assert len(found.indices) > 0
        np.testing.assert_array_equal(found.indices, expected.indices)
        np.testing.assert_array_equal(found.values, expected.values)


def test_an_output_made_with_a_recipe_file_gives_its_encoder(tmp_path, corpus, tiny_st):
    bundled = (ROOT / "recipes" / "e5-base-v2.yaml").read_text()
    recipe = tmp_path / "recipes" / "my-e5.yaml"
    recipe.parent.mkdir()
    recipe.write_text(bundled.replace('query: "query: "', 'query: "find: "'))
    model = tiny_st("mean")
    out = _run(corpus, model, tmp_path / "out", "--recipe", str(recipe))
    with bulkembed.load(out) as made, bulkembed.load(model, recipe=str(recipe)) as named:
        assert made.embed_query(QUERY) == named.embed_query(QUERY)
    with bulkembed.load(model, recipe="e5-base-v2") as other:
        assert made.embed_query(QUERY) != other.embed_query(QUERY)


def test_an_int8_output_quantizes_queries_with_its_scale(tmp_path, corpus, tiny_st):
    model = tiny_st("mean")
    out = _run(corpus, model, tmp_path / "out", "--quantize", "int8")
    ranges = np.array(
        json.loads((out / "_bulkembed" / "quantization.json").read_text())["ranges"], np.float32
    )
    with bulkembed.load(out) as made, bulkembed.load(model) as plain:
        found = np.array(made.embed_query(QUERY))
        vector = plain.encode_query(QUERY).dense[0]
    steps = (ranges[1] - ranges[0]) / 255
    expected = np.clip(np.floor((vector - ranges[0]) / np.where(steps == 0, 1, steps)), 0, 255)
    np.testing.assert_array_equal(found, expected - 128)
    # Another text's first call calibrates a plain int8 encoder on itself instead.
    with bulkembed.load(model, quantize="int8") as calibrating:
        assert calibrating.embed_documents(["a", "b c"]) != made.embed_documents(["a", "b c"])


def test_a_lancedb_table_gives_its_encoder(tmp_path, corpus, tiny_st):
    model = tiny_st("mean")
    uri = f"lancedb://{tmp_path / 'db'}?table=docs"
    _run(corpus, model, uri, "--dim", "16")
    with bulkembed.load(uri) as made, bulkembed.load(model, dim=16) as named:
        assert made.embed_query(QUERY) == named.embed_query(QUERY)


def test_an_output_on_s3_gives_its_encoder(tmp_path, corpus, tiny_st, s3):
    model = tiny_st("mean")
    _run(corpus, model, s3.uri("out"), "--dim", "8")
    with bulkembed.load(s3.uri("out")) as made, bulkembed.load(model, dim=8) as named:
        assert made.embed_query(QUERY) == named.embed_query(QUERY)


def test_settings_the_output_records_are_refused_and_the_others_taken(tmp_path, corpus, tiny_st):
    model = tiny_st("mean")
    out = _run(corpus, model, tmp_path / "out", "--dim", "16")
    with pytest.raises(UsageError, match=r"records the settings .*: leave out dim, prompt_name$"):
        bulkembed.load(out, dim=8, prompt_name="query", device="cpu")
    with bulkembed.load(out, device="cpu", dtype="float32", max_batch_tokens=256) as made:
        assert made.dtype == "float32" and made.dim == 16


def test_a_moved_model_is_named_and_other_weights_are_refused(tmp_path, corpus, tiny_st):
    first, other = tiny_st("mean"), tiny_st("cls")
    moved = tmp_path / "moved"
    shutil.copytree(first, moved)
    out = _run(corpus, moved, tmp_path / "out")
    shutil.rmtree(moved)
    with pytest.raises(ModelError, match=rf"made with the model {moved}, which cannot be loaded"):
        bulkembed.load(out)
    with bulkembed.load(out, model=first) as made, bulkembed.load(first) as named:
        assert made.embed_query(QUERY) == named.embed_query(QUERY)
    with pytest.raises(
        ModelError, match=r"made with the weights sha256-whole:\w+ of .*, not these"
    ):
        bulkembed.load(out, model=other)


def test_what_is_not_an_output_of_this_version_is_a_one_line_error(tmp_path, corpus, tiny_st):
    model = tiny_st("mean")
    out = _run(corpus, model, tmp_path / "out")
    config = out / "_bulkembed" / "config.json"
    written = json.loads(config.read_text())
    del written["encoder"]
    config.write_text(json.dumps(written))
    with pytest.raises(UsageError, match="written by an earlier bulkembed"):
        bulkembed.load(out)
    with pytest.raises(UsageError, match="holds no bulkembed run"):
        bulkembed.load(f"lancedb://{tmp_path / 'none'}?table=t")


@pytest.mark.parametrize("kind", ["parquet", "lancedb"])
def test_an_edited_encoder_record_is_refused_naming_both_values(tmp_path, corpus, tiny_st, kind):
    model = tiny_st("mean")
    if kind == "parquet":
        out = _run(corpus, model, tmp_path / "out")
        config = out / "_bulkembed" / "config.json"
    else:
        out = _run(corpus, model, f"lancedb://{tmp_path / 'db'}?table=docs")
        config = tmp_path / "db" / "_bulkembed" / "docs" / "config.json"
    written = json.loads(config.read_text())
    written["encoder"]["max_length"] = 16
    written["encoder"]["prompt"] = "query: "
    config.write_text(json.dumps(written))
    line = (
        f"{config} records the encoder's max_length as 16, its rows were written with 64: "
        "the record was edited or damaged; restore config.json (its `encoder` is the "
        "bulkembed.encoder of the rows' schema), or embed the corpus again"
    )
    with pytest.raises(OutputError) as refused:
        bulkembed.load(out)
    assert str(refused.value).endswith(line) and "\n" not in str(refused.value)
    result = CliRunner().invoke(app, ["embed", "--like", str(out), QUERY])
    assert result.exit_code == 1
    assert result.output.strip().endswith(line) and "Traceback" not in result.output


def test_embed_like_an_output(tmp_path, corpus, tiny_st):
    model = tiny_st("mean")
    out = _run(corpus, model, tmp_path / "out", "--dim", "16")
    result = CliRunner().invoke(app, ["embed", "--like", str(out), "--query", QUERY])
    assert result.exit_code == 0, result.output
    with bulkembed.load(out) as made:
        expected = made.encode_query(QUERY).dense[0]
    np.testing.assert_array_equal(np.float32(json.loads(result.stdout)["dense"]), expected)
    refused = CliRunner().invoke(app, ["embed", "--like", str(out), "--dim", "8", QUERY])
    assert refused.exit_code == 2
    assert "leave out dim" in refused.output
    missing = CliRunner().invoke(app, ["embed", QUERY])
    assert missing.exit_code == 2 and "--model" in missing.output
    model = CliRunner().invoke(app, ["embed", "--like", str(tiny_st("mean")), QUERY])
    assert model.exit_code == 2 and "is not an output bulkembed wrote" in model.output


def test_the_documented_duckdb_search_ranks_as_numpy(tmp_path, corpus, tiny_st, monkeypatch):
    from helpers import ROOT

    out = _run(corpus, tiny_st("mean"), tmp_path / "out")
    page = (ROOT / "docs" / "outputs.md").read_text()
    section = page.split("## Searching the Parquet output with DuckDB", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    # As written there, but for the question.
    code = code.replace("how do I sort a list?", QUERY)
    monkeypatch.chdir(tmp_path)
    found: dict = {}
    exec(compile(code, "docs/outputs.md", "exec"), found)
    top, query = found["top"], found["query"]
    table = pq.read_table(out)
    vectors = np.array(table.column("dense").to_pylist())
    scores = vectors @ np.array(query) / np.linalg.norm(vectors, axis=1) / np.linalg.norm(query)
    expected = [table.column("id")[int(i)].as_py() for i in np.argsort(-scores)[:5]]
    assert [row[0] for row in top] == expected
    np.testing.assert_allclose([row[1] for row in top], np.sort(scores)[::-1][:5], rtol=1e-5)


def test_documents_and_queries_take_the_prompts_the_output_was_made_with(tmp_path, corpus, tiny_st):
    model = tiny_st("mean")
    out = _run(corpus, model, tmp_path / "out", "--prompt", "passage: ")
    with bulkembed.load(out) as made, bulkembed.load(model, prompt="passage: ") as named:
        assert made.document_prompt == "passage: " and named.document_prompt == ""
        assert made.embed_documents(["a text"]) == named.encode(["a text"]).dense.tolist()
    # The query prompt the model had when the output was made, whatever it has now: the
    # record of the rows and of config.json, as a model with that query prompt wrote them.
    config = out / "_bulkembed" / "config.json"
    written = json.loads(config.read_text())
    written["encoder"]["query_prompt"] = "query: "
    config.write_text(json.dumps(written))
    for part in out.glob("*.parquet"):
        table = pq.read_table(part)
        metadata = {**table.schema.metadata, b"bulkembed.encoder": json.dumps(written["encoder"])}
        pq.write_table(table.replace_schema_metadata(metadata), part)
    with bulkembed.load(out) as made, bulkembed.load(model) as plain:
        assert made.query_prompt == "query: "
        assert made.embed_query("a text") == plain.encode("query: a text").dense[0].tolist()

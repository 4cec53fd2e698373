"""A table bulkembed wrote names bulkembed's LanceDB embedding function: text searches embed
the query with the table's model and settings."""

import json

import duckdb
import lancedb
import numpy as np
import pytest
from helpers import records, run_cli, write_parquet

import bulkembed
import bulkembed.lancedb  # noqa: F401 (registers the function)

QUERY = "a question about the weather and the sea"


@pytest.fixture
def table(tmp_path, tiny_st):
    model = tiny_st("mean")
    write_parquet(tmp_path / "corpus" / "a.parquet", records(60), row_group_size=30)
    uri = f"lancedb://{tmp_path / 'db'}?table=docs"
    options = ("--keep-columns", "text", "--fts", "--dim", "16")
    result = run_cli(tmp_path / "corpus", model, uri, *options)
    assert result.exit_code == 0, result.output
    return uri, lancedb.connect(tmp_path / "db").open_table("docs")


def _duckdb_top(table, vector: list[float], k: int) -> list[str]:
    connection = duckdb.connect()
    connection.register("docs", table.to_arrow().select(["id", "vector"]))
    found = connection.execute(
        "SELECT id FROM docs ORDER BY list_cosine_similarity(vector, $q::FLOAT[]) DESC LIMIT $k",
        {"q": vector, "k": k},
    ).fetchall()
    return [r[0] for r in found]


def test_the_table_records_the_function_and_its_settings(table):
    uri, opened = table
    (function,) = json.loads(opened.schema.metadata[b"embedding_functions"])
    assert function["name"] == "bulkembed: import bulkembed.lancedb first"
    assert (function["source_column"], function["vector_column"]) == ("text", "vector")
    assert function["model"]["dim"] == 16
    assert set(opened.embedding_functions) == {"vector"}


def test_a_text_search_embeds_the_query_as_load_does(table):
    uri, opened = table
    with bulkembed.load(uri) as made:
        vector = made.embed_query(QUERY)
    found = [r["id"] for r in opened.search(QUERY).limit(5).to_list()]
    assert found == _duckdb_top(opened, vector, 5)
    # Text-only hybrid search embeds the query the same way.
    hybrid = opened.search(QUERY, query_type="hybrid").limit(5).to_list()
    given = opened.search(query_type="hybrid").vector(vector).text(QUERY).limit(5).to_list()
    assert [r["id"] for r in hybrid] == [r["id"] for r in given]
    np.testing.assert_allclose(
        [r["_relevance_score"] for r in hybrid], [r["_relevance_score"] for r in given]
    )


def test_rows_added_through_lancedb_get_document_vectors(table):
    uri, opened = table
    opened.add([{"id": "added", "content_hash": "0" * 32, "text": "a new document"}])
    (row,) = opened.search().where("id = 'added'").limit(1).to_list()
    with bulkembed.load(uri) as made:
        expected = made.encode_document("a new document").dense[0]
    np.testing.assert_allclose(row["vector"], expected, rtol=1e-6)


_OTHER_PROCESS = """
import sys
import lancedb
if sys.argv[2] == "import":
    import bulkembed.lancedb
table = lancedb.connect(sys.argv[1]).open_table("docs")
try:
    table.search("a question about the weather").limit(2).to_list()
except KeyError as e:
    print("search:", e)
else:
    print("search: ok")
"""


def test_a_process_that_did_not_register_the_function_is_told_the_import(table, tmp_path):
    import subprocess
    import sys

    from lancedb.embeddings import get_registry

    from bulkembed.sinks.lance_function import BulkembedFunction

    uri, _ = table
    folder = uri.removeprefix("lancedb://").split("?")[0]
    found = {}
    for way in ("plain", "import"):
        done = subprocess.run(
            [sys.executable, "-c", _OTHER_PROCESS, folder, way],
            capture_output=True,
            text=True,
            check=True,
        )
        found[way] = done.stdout.strip()
    assert found == {
        "plain": "search: 'bulkembed: import bulkembed.lancedb first'",
        "import": "search: ok",
    }
    # Tables written before name the function `bulkembed`: it is registered so too.
    assert get_registry().get("bulkembed") is BulkembedFunction

"""LangChain: the encoder is an `Embeddings` with async calls that leave the event loop free,
and what a run wrote opens as a vector store without embedding the corpus again."""

import asyncio
import time

import duckdb
import numpy as np
import pytest
from helpers import record_calls, run_cli, sample_texts, write_jsonl
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.vectorstores import InMemoryVectorStore

import bulkembed
from bulkembed.engine import stream
from bulkembed.errors import UsageError

QUERIES = ["how do I sort a list in python", "the history of the roman empire", "weather"]


def _load(model):
    return bulkembed.load(model, dtype="float32", max_batch_tokens=512)


def test_the_encoder_is_a_langchain_embeddings_subclass(tiny_st):
    encoder = _load(tiny_st("mean"))
    assert isinstance(encoder, Embeddings)
    assert issubclass(bulkembed.TextEncoder, Embeddings)


def test_async_retrieval_returns_what_the_sync_call_does(tiny_st):
    encoder = _load(tiny_st("mean"))
    texts = sample_texts(60)
    store = InMemoryVectorStore(embedding=encoder)
    store.add_documents([Document(page_content=t, id=f"t{i}") for i, t in enumerate(texts)])
    retriever = store.as_retriever(search_kwargs={"k": 5})
    for query in QUERIES:
        found = asyncio.run(retriever.ainvoke(query))
        assert [d.id for d in found] == [d.id for d in retriever.invoke(query)]
    vectors = asyncio.run(encoder.aembed_documents(texts[:3]))
    np.testing.assert_array_equal(np.array(vectors), encoder.encode_document(texts[:3]).dense)
    query = asyncio.run(encoder.aembed_query(QUERIES[0]))
    assert query == encoder.embed_query(QUERIES[0])


def test_async_calls_leave_the_event_loop_free_and_run_one_at_a_time(tiny_st, monkeypatch):
    encoder = _load(tiny_st("mean"))
    texts = sample_texts(400)
    inside = []

    def embed_windows(*args, original=stream.embed_windows):
        inside.append(1)
        assert len(inside) == 1, "two calls embed at once"
        time.sleep(0.2)
        try:
            return original(*args)
        finally:
            inside.pop()

    monkeypatch.setattr(stream, "embed_windows", embed_windows)

    async def main():
        ticks = 0
        calls = asyncio.gather(*(encoder.aembed_documents(texts) for _ in range(3)))
        while not calls.done():
            ticks += 1
            await asyncio.sleep(0.01)
        return ticks, await calls

    ticks, results = asyncio.run(main())
    # The loop ran on while the three calls (0.6 s at least, one at a time) embedded.
    assert ticks >= 20
    assert results[0] == results[1] == results[2] == encoder.embed_documents(texts)


@pytest.fixture
def kept_texts(tmp_path, tiny_st):
    """A run over 200 documents with their texts and a `source` kept; its output."""
    records = [
        {"id": f"d{i}", "text": t, "source": f"s{i % 3}"} for i, t in enumerate(sample_texts(200))
    ]
    write_jsonl(tmp_path / "corpus.jsonl", records)
    return records


def _duckdb_top(output_glob, vector, k):
    """The ids of the `k` rows nearest to `vector` by the dot product, as DuckDB finds them."""
    rows = duckdb.sql(
        f"SELECT id FROM read_parquet('{output_glob}') "
        f"ORDER BY list_inner_product(dense, ?::FLOAT[]) DESC, id LIMIT {k}",
        params=[list(map(float, vector))],
    ).fetchall()
    return [r[0] for r in rows]


def test_a_parquet_output_is_a_vector_store_that_embeds_only_the_query(
    tmp_path, tiny_st, kept_texts, monkeypatch
):
    from bulkembed.langchain import OutputStore

    out = tmp_path / "out"
    arguments = ("--keep-columns", "text,source", "--dtype", "float32")
    assert run_cli(tmp_path / "corpus.jsonl", tiny_st("mean"), out, *arguments).exit_code == 0
    store = OutputStore(out, device="cpu")
    embedded = record_calls(monkeypatch, type(store.embeddings), "_embed", lambda _, t, p: t)
    texts = {r["id"]: r for r in kept_texts}
    for query in QUERIES:
        found = store.similarity_search_with_score(query, k=5)
        vector = store.embeddings.embed_query(query)
        assert [d.id for d, _ in found] == _duckdb_top(f"{out}/*.parquet", vector, 5)
        for document, score in found:
            assert document.page_content == texts[document.id]["text"]
            assert document.metadata == {"source": texts[document.id]["source"]}
            assert 0 < score <= 1
    # The query of each search (and of each direct embed_query), and not one document.
    assert embedded == [[q] for q in QUERIES for _ in range(2)]
    retriever = store.as_retriever(search_kwargs={"k": 5})
    found = asyncio.run(retriever.ainvoke(QUERIES[1]))
    assert [d.id for d in found] == [d.id for d in retriever.invoke(QUERIES[1])]


def test_a_lancedb_output_is_a_vector_store_with_the_same_neighbours(tmp_path, tiny_st, kept_texts):
    from bulkembed.langchain import OutputStore

    corpus, model = tmp_path / "corpus.jsonl", tiny_st("mean")
    arguments = ("--keep-columns", "text,source", "--dtype", "float32")
    assert run_cli(corpus, model, tmp_path / "out", *arguments).exit_code == 0
    assert run_cli(corpus, model, f"lancedb://{tmp_path / 'db'}", *arguments).exit_code == 0
    parquet = OutputStore(tmp_path / "out", device="cpu")
    lance = OutputStore(f"lancedb://{tmp_path / 'db'}", device="cpu")
    for query in QUERIES:
        expected = parquet.similarity_search_with_score(query, k=5)
        found = lance.similarity_search_with_score(query, k=5)
        assert [d.id for d, _ in found] == [d.id for d, _ in expected]
        assert [d.metadata for d, _ in found] == [d.metadata for d, _ in expected]
        np.testing.assert_allclose([s for _, s in found], [s for _, s in expected], atol=1e-5)


def test_an_output_store_says_what_it_cannot_do(tmp_path, tiny_st, kept_texts):
    from bulkembed.langchain import OutputStore

    out = tmp_path / "out"
    assert (
        run_cli(tmp_path / "corpus.jsonl", tiny_st("mean"), out, "--dtype", "float32").exit_code
        == 0
    )
    store = OutputStore(out, device="cpu")
    with pytest.raises(UsageError, match="holds no column 'text': run with --keep-columns text"):
        store.similarity_search("anything")
    with pytest.raises(UsageError, match="add documents to the corpus and run the command again"):
        store.add_texts(["more"])
    with pytest.raises(UsageError, match="InMemoryVectorStore.from_texts"):
        OutputStore.from_texts(["a"], store.embeddings)

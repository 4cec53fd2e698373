"""What `bulkembed run` wrote, as a LangChain vector store: nothing is embedded again but
the queries. Needs `langchain-core` (`pip install 'bulkembed[langchain]'`).

    from bulkembed.langchain import OutputStore

    store = OutputStore("out/")  # a Parquet output, or lancedb://PATH?table=NAME
    store.as_retriever(search_kwargs={"k": 5}).invoke("how do I sort a list?")

Queries are embedded by `bulkembed.load(OUTPUT)`, the encoder the output records (its
query prompt, int8/uint8 scale included), or by the `embedding` given. A document's
`page_content` is its `text_column` (keep it with `--keep-columns text`), its `id` the
row's id, and its `metadata` the other columns kept. A Parquet output is searched
exactly, in memory: its dense vectors are read once, at the first search (about 1.5 GB a
million 384-dimension vectors; use LanceDB, with an index, past that). A LanceDB table is
searched by LanceDB, through its index where it has one.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bulkembed.api import TextEncoder, load
from bulkembed.errors import UsageError
from bulkembed.schema import CONTENT_HASH, EMBEDDING_COLUMNS
from bulkembed.storage import ObjectPath

try:
    from langchain_core.documents import Document
    from langchain_core.vectorstores import VectorStore
except ImportError as e:  # pragma: no cover - the extra names the package
    raise ImportError(
        "bulkembed.langchain needs langchain-core: pip install 'bulkembed[langchain]'"
    ) from e

# Columns that are not a document's metadata.
_NOT_METADATA = {"id", CONTENT_HASH, *EMBEDDING_COLUMNS, "vector"}


class OutputStore(VectorStore):
    """The rows of a bulkembed output (see the module's docstring) as a read-only LangChain
    `VectorStore`: `similarity_search`, `similarity_search_with_score` (the dot product of
    the query's and the document's vectors: their cosine, for normalised vectors),
    `similarity_search_by_vector`, `as_retriever`, and their async forms."""

    def __init__(
        self,
        output: str | os.PathLike[str],
        text_column: str = "text",
        embedding: TextEncoder | None = None,
        **settings: Any,
    ) -> None:
        from bulkembed.sinks import parse_output

        self.output = os.fspath(output)
        self.text_column = text_column
        self._encoder = embedding if embedding is not None else load(self.output, **settings)
        target = parse_output(self.output, None)
        if target.path is None:
            raise UsageError(f"{self.output} is a stream: open the output it was saved to")
        if target.kind == "lancedb":
            assert target.name is not None
            self._search: _Search = _LanceSearch(target.path, target.name)
        else:
            self._search = _ParquetSearch(target.path)

    @property
    def embeddings(self) -> TextEncoder:
        """The encoder that embeds the queries."""
        return self._encoder

    def similarity_search(self, query: str, k: int = 4, **kwargs: Any) -> list[Document]:
        """The `k` documents nearest to `query`, nearest first."""
        return [document for document, _ in self.similarity_search_with_score(query, k)]

    def similarity_search_with_score(
        self, query: str, k: int = 4, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        """The `k` documents nearest to `query`, nearest first, with their scores."""
        return self._nearest(np.asarray(self._encoder.embed_query(query)), k)

    def similarity_search_by_vector(
        self, embedding: list[float], k: int = 4, **kwargs: Any
    ) -> list[Document]:
        """The `k` documents nearest to `embedding`, nearest first."""
        return [document for document, _ in self._nearest(np.asarray(embedding), k)]

    def _select_relevance_score_fn(self) -> Callable[[float], float]:
        # The scores are cosines (normalised vectors): relevance from 0 to 1.
        return lambda score: (score + 1.0) / 2.0

    def _nearest(self, vector: np.ndarray, k: int) -> list[tuple[Document, float]]:
        rows, scores = self._search.nearest(vector.astype(np.float32), k)
        found = []
        for row, score in zip(rows.to_pylist(), scores, strict=True):
            text = row.get(self.text_column)
            if text is None and self.text_column not in row:
                raise UsageError(
                    f"{self.output} holds no column {self.text_column!r}: run with "
                    f"--keep-columns {self.text_column}, or name the column (text_column=)"
                )
            metadata = {
                k: v for k, v in row.items() if k not in _NOT_METADATA and k != self.text_column
            }
            document = Document(page_content=text or "", metadata=metadata, id=str(row["id"]))
            found.append((document, float(score)))
        return found

    def add_texts(
        self, texts: Iterable[str], metadatas: list[dict] | None = None, **kwargs: Any
    ) -> list[str]:
        raise UsageError(
            "an OutputStore is what bulkembed run wrote: add documents to the corpus and run "
            "the command again (--since embeds only those new or changed)"
        )

    @classmethod
    def from_texts(
        cls,
        texts: list[str],
        embedding: Any,
        metadatas: list[dict] | None = None,
        **kwargs: Any,
    ) -> OutputStore:
        raise UsageError(
            "OutputStore opens what bulkembed run wrote (OutputStore(OUTPUT)); for texts in "
            "hand, use InMemoryVectorStore.from_texts(texts, bulkembed.load(MODEL))"
        )


class _Search:
    """Nearest rows of an output to a query vector."""

    def nearest(self, vector: np.ndarray, k: int) -> tuple[pa.Table, list[float]]:
        raise NotImplementedError


class _ParquetSearch(_Search):
    """Exact search of a Parquet output's dense vectors, read once into memory."""

    def __init__(self, path: Any) -> None:
        self.path = path
        self._rows: pa.Table | None = None
        self._vectors: np.ndarray | None = None

    def _read(self) -> tuple[pa.Table, np.ndarray]:
        if self._rows is None or self._vectors is None:
            if isinstance(self.path, ObjectPath):
                table = pq.read_table(self.path.key, filesystem=self.path.fs)
            else:
                table = pq.read_table(self.path)
            if "dense" not in table.column_names:
                raise UsageError(f"{self.path} holds no dense vectors to search")
            dense = table.column("dense").combine_chunks()
            width = dense.type.list_size
            if (
                pa.types.is_integer(dense.type.value_type)
                and table.schema.metadata
                and (table.schema.metadata.get(b"bulkembed.metric") == b"hamming")
            ):
                raise UsageError(f"{self.path} holds binary vectors: search them with LanceDB")
            values = dense.values.to_numpy(zero_copy_only=False).astype(np.float32)
            self._vectors = values.reshape(-1, width)
            self._rows = table.drop_columns(
                [c for c in table.column_names if c in EMBEDDING_COLUMNS]
            )
        return self._rows, self._vectors

    def nearest(self, vector: np.ndarray, k: int) -> tuple[pa.Table, list[float]]:
        rows, vectors = self._read()
        scores = vectors @ vector
        # Highest score first; rows in output order among equal scores.
        order = np.lexsort((np.arange(len(scores)), -scores))[:k]
        return rows.take(pa.array(order, pa.int64())), scores[order].tolist()


class _LanceSearch(_Search):
    """LanceDB's search of a table's `vector` column."""

    def __init__(self, path: Any, table: str) -> None:
        import lancedb

        self._table = lancedb.connect(str(path)).open_table(table)
        metadata = self._table.schema.metadata or {}
        # The metric the table was written for: `cosine`, or `dot` for unnormalised vectors.
        self._metric = metadata.get(b"bulkembed.metric", b"cosine").decode()

    def nearest(self, vector: np.ndarray, k: int) -> tuple[pa.Table, list[float]]:
        search: Any = self._table.search(vector.tolist(), vector_column_name="vector")
        found = search.distance_type(self._metric).limit(k).to_arrow()
        distances = found.column("_distance").to_numpy()
        # LanceDB's cosine and dot distances are 1 minus the cosine or the dot product.
        rows = found.drop_columns(["_distance", "vector"])
        return rows, (1.0 - distances).tolist()

"""bulkembed's entry in LanceDB's registry of embedding functions (`schema.EMBEDDING_FUNCTION`).

A table that `bulkembed run` writes names this function in its schema for its `vector`
column, with the settings its vectors were made with (`bulkembed.output.recorded`) as its fields.
LanceDB reads that entry whenever it writes to the table or embeds text for it, and fails on
a name it does not know: so every process of bulkembed that opens a database registers it
(`lance_index.lance_modules`), and so does `import bulkembed.lancedb`, which also gives the
function its model (`loader`): only then does it embed text. LanceDB has no way to find a
function on its own (0.40: no entry points); in a process that has not registered it, the
name LanceDB fails on, `bulkembed: import bulkembed.lancedb first`, says what to do.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any, Protocol

from lancedb.embeddings import TextEmbeddingFunction, get_registry

from bulkembed.errors import UsageError
from bulkembed.schema import EARLIER_EMBEDDING_FUNCTION, EMBEDDING_FUNCTION


class TextEncoderLike(Protocol):
    """What the function needs of `bulkembed.TextEncoder`."""

    @property
    def dim(self) -> int | None: ...

    def embed_documents(self, texts: list[str]) -> list[list[float]]: ...

    def embed_query(self, text: str) -> list[float]: ...

    def embed_images(self, images: Any) -> list[list[float]]: ...


# Makes the encoder of a record (`bulkembed.lancedb` sets it); None: text cannot be embedded.
loader: Callable[[dict[str, Any]], TextEncoderLike] | None = None
_ENCODERS: dict[str, TextEncoderLike] = {}
_LOADING = threading.Lock()


class BulkembedFunction(TextEmbeddingFunction):
    """The encoder a bulkembed table's vectors were made with; its fields are the record."""

    model: str
    revision: str | None = None
    recipe: str | None = None
    pooling: str | None = None
    normalize: bool | None = None
    prompt: str | None = None
    outputs: list[str] | None = None
    sparse_top_k: int | None = None
    dim: int | None = None
    dtype_out: str = "float32"
    quantize: str | None = None
    max_length: int | None = None
    version: str = ""
    query_prompt: str | None = None
    # A model that cannot load does not load on a second try: its error is raised at once.
    max_retries: int = 0

    def ndims(self) -> int:
        dim = self._encoder().dim
        assert dim is not None, "tables name the function for dense vectors only"
        return dim

    def generate_embeddings(self, texts: Any, *args: Any, **kwargs: Any) -> list[Any]:
        """The document vector of each text; None for a value that is no text (a null)."""
        listed = list(texts)
        strings = [t for t in listed if isinstance(t, str)]
        vectors = iter(self._encoder().embed_documents(strings) if strings else [])
        return [next(vectors) if isinstance(t, str) else None for t in listed]

    def compute_query_embeddings(self, query: Any, *args: Any, **kwargs: Any) -> list[Any]:
        """The query vector of a text; of an image (a PIL image, bytes or a path object),
        a two-tower model's image vector, so that `table.search(image)` finds the images
        nearest to it."""
        if isinstance(query, str):
            return [self._encoder().embed_query(query)]
        return self._encoder().embed_images([query])

    def _encoder(self) -> TextEncoderLike:
        """The encoder of these settings, loaded once per process."""
        if loader is None:
            raise UsageError(
                "LanceDB asks bulkembed to embed text: import bulkembed.lancedb first, which "
                "loads the table's model"
            )
        fields = self.model_dump(exclude={"max_retries"})
        key = json.dumps(fields, sort_keys=True)
        with _LOADING:
            if key not in _ENCODERS:
                _ENCODERS[key] = loader(fields)
            return _ENCODERS[key]


def register() -> None:
    """Put the function in LanceDB's registry, once, under its name and the name tables
    written before gave it (the last registered is what LanceDB records of it)."""
    registry = get_registry()
    try:
        registry.get(EMBEDDING_FUNCTION)
    except KeyError:
        registry.register(EARLIER_EMBEDDING_FUNCTION)(BulkembedFunction)
        registry.register(EMBEDDING_FUNCTION)(BulkembedFunction)

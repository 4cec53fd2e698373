"""bulkembed in LanceDB's registry of embedding functions, under the name `bulkembed`.

A table that `bulkembed run` writes names this function in its schema for its `vector`
column, with the settings its vectors were made with (`bulkembed.recorded`), and its text
column as the source. In a process that imported this module, LanceDB embeds text with
them: `table.search("how do I ...")` and a text-only hybrid search embed the query as
`bulkembed.load(TABLE).embed_query` does, and rows added through LanceDB without a vector
get the one `encode_document` gives. The model is loaded once per process and settings, on
first use, on the device `BULKEMBED_DEVICE` names (default `auto`).

    import bulkembed.lancedb  # noqa: F401 (registers the function)
    table = lancedb.connect("db").open_table("embeddings")
    table.search("how do I sort a list?").limit(5).to_list()
"""

from __future__ import annotations

import json
import os
import threading
from typing import TYPE_CHECKING, Any

from lancedb.embeddings import TextEmbeddingFunction, get_registry

from bulkembed.api import load_recorded
from bulkembed.recorded import RECORDED
from bulkembed.sinks.lance import EMBEDDING_FUNCTION

if TYPE_CHECKING:
    from bulkembed.api import TextEncoder

_ENCODERS: dict[str, TextEncoder] = {}
_LOADING = threading.Lock()


@get_registry().register(EMBEDDING_FUNCTION)
class BulkembedFunction(TextEmbeddingFunction):
    """The encoder a bulkembed table's vectors were made with (its fields: the record)."""

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
    # A model that cannot load does not load on a second try: its error is raised at once.
    max_retries: int = 0

    def ndims(self) -> int:
        dim = self._encoder().dim
        assert dim is not None, "tables get the function for dense vectors only"
        return dim

    def generate_embeddings(self, texts: Any, *args: Any, **kwargs: Any) -> list[Any]:
        dense = self._encoder().encode_document([str(t) for t in texts]).dense
        assert dense is not None
        return list(dense)

    def compute_query_embeddings(self, query: str, *args: Any, **kwargs: Any) -> list[Any]:
        dense = self._encoder().encode_query([query]).dense
        assert dense is not None
        return [dense[0]]

    def _encoder(self) -> TextEncoder:
        """The encoder of these settings, loaded once per process."""
        record = {name: getattr(self, name) for name in (*RECORDED, "version")}
        key = json.dumps(record, sort_keys=True)
        with _LOADING:
            if key not in _ENCODERS:
                version = record.pop("version")
                device = os.environ.get("BULKEMBED_DEVICE", "auto")
                label = "the LanceDB table's vector column"
                _ENCODERS[key] = load_recorded(label, record, version, None, {"device": device})
            return _ENCODERS[key]

"""bulkembed's LanceDB embedding function, able to embed: `import bulkembed.lancedb`.

A table that `bulkembed run` writes names the function `bulkembed` for its `vector` column,
with the settings its vectors were made with, and its text column as the source. In a
process that imported this module, LanceDB embeds text with them: `table.search("...")`
and a text-only hybrid search embed the query as `bulkembed.load(TABLE).embed_query` does,
and rows added through LanceDB without a vector get the one `embed_documents` gives. The
model is loaded once per process and settings, on first use, on the device
`BULKEMBED_DEVICE` names (default `auto`).

    import bulkembed.lancedb  # noqa: F401 (lets LanceDB embed text with the table's model)
    table = lancedb.connect("db").open_table("embeddings")
    table.search("how do I sort a list?").limit(5).to_list()
"""

from __future__ import annotations

import os
from typing import Any

from bulkembed.api import TextEncoder, load_recorded
from bulkembed.sinks import lance_function


def _load(record: dict[str, Any]) -> TextEncoder:
    """The encoder of a table's record (`bulkembed.output.recorded.encoder_record`)."""
    device = os.environ.get("BULKEMBED_DEVICE", "auto")
    return load_recorded("the LanceDB table's vector column", record, None, {"device": device})


lance_function.register()
lance_function.loader = _load

"""bulkembed: turn a text corpus into embeddings, in bulk."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bulkembed.version import __version__

__all__ = ["__version__", "embed_corpus"]

if TYPE_CHECKING:
    from bulkembed.config import RunConfig
    from bulkembed.summary import Summary


def embed_corpus(config: RunConfig, **kwargs: Any) -> Summary:
    """Embed a corpus as `bulkembed run` does; see `bulkembed.engine.run.embed_corpus`."""
    from bulkembed.engine.run import embed_corpus as run

    return run(config, **kwargs)

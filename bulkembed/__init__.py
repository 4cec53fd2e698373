"""bulkembed: turn a text corpus into embeddings, in bulk."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from bulkembed.errors import (
    BulkembedError,
    InputError,
    Interrupted,
    ModelError,
    OutputError,
    OutputLocked,
    TooManyBadRecords,
    TooManyDeletes,
    UsageError,
    WorkerError,
)
from bulkembed.version import __version__

__all__ = [
    "BatchSettings",
    "BulkembedError",
    "Embeddings",
    "InputError",
    "InputSettings",
    "Interrupted",
    "ModelError",
    "ModelSettings",
    "OutputError",
    "OutputLocked",
    "OutputSettings",
    "RunConfig",
    "RunSettings",
    "SparseRows",
    "SparseVector",
    "TextEncoder",
    "TooManyBadRecords",
    "TooManyDeletes",
    "UsageError",
    "WorkerError",
    "__version__",
    "embed_corpus",
    "load",
]

if TYPE_CHECKING:
    from bulkembed.api import TextEncoder
    from bulkembed.config import (
        BatchSettings,
        InputSettings,
        ModelSettings,
        OutputSettings,
        RunConfig,
        RunSettings,
    )
    from bulkembed.contracts import Embeddings, SparseRows, SparseVector
    from bulkembed.reporting.summary import Summary

# Names imported on first use, so that `import bulkembed` imports neither torch nor numpy.
_LAZY = {
    **{
        name: "bulkembed.config"
        for name in (
            "RunConfig",
            "InputSettings",
            "ModelSettings",
            "BatchSettings",
            "OutputSettings",
            "RunSettings",
        )
    },
    "TextEncoder": "bulkembed.api",
    "Embeddings": "bulkembed.contracts",
    "SparseRows": "bulkembed.contracts",
    "SparseVector": "bulkembed.contracts",
}


def embed_corpus(config: RunConfig, **kwargs: Any) -> Summary:
    """Embed a corpus as `bulkembed run` does; see `bulkembed.engine.run.embed_corpus`."""
    from bulkembed.engine.run import embed_corpus as run

    return run(config, **kwargs)


def load(model: str | os.PathLike[str], /, **settings: Any) -> TextEncoder:
    """An in-process encoder for `model`; see `bulkembed.api.load`."""
    from bulkembed.api import load as load_model

    return load_model(model, **settings)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'bulkembed' has no attribute {name!r}")

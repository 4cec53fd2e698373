"""Models on the Hugging Face Hub: whether one is in the cache, downloading one ahead of an
offline run (`bulkembed pull`), and a one-line reason when one cannot be found.

A model that cannot be found gets one of four messages, each with what to do: a path
that names no folder; a hub id whose files are not in the cache while the Hub cannot be
reached (offline); a hub id the Hub does not have (with the bundled recipes whose names
are close: "did you mean"); a revision the Hub does not have.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from bulkembed.errors import ModelError, UsageError

# What a run reads of a model: configuration, tokenizer, weights (safetensors, or
# PyTorch's where the repository has no safetensors), sentence-transformers' modules and
# BGE-M3's heads. Other formats (ONNX, OpenVINO, TensorFlow, Flax) are left on the Hub.
_SKIPPED = [
    "onnx/*",
    "openvino/*",
    "*.onnx",
    "*.onnx_data",
    "*.h5",
    "*.msgpack",
    "*.ot",
    "tf_model*",
    "flax_model*",
    "rust_model*",
    "coreml/*",
    "*.mlmodel",
]


def looks_like_a_path(source: str) -> bool:
    """Whether `source` is written as a path (`./model`, `/models/e5`, `~/m`, `models/`),
    not as a hub id (`org/name`) or a recipe."""
    return source.startswith(("/", "./", "../", "~")) or source.endswith(("/", "\\"))


def close_recipes(name: str) -> list[str]:
    """The bundled recipes whose names are close to `name`, closest first."""
    from bulkembed.models.recipes import list_recipes

    names = [r.name for r in list_recipes()]
    return difflib.get_close_matches(name.lower(), names, n=3, cutoff=0.75)


def did_you_mean(name: str) -> str:
    """`; did you mean all-minilm-l6-v2?`, or nothing where no recipe is close."""
    close = close_recipes(name)
    return f"; did you mean {' or '.join(close)}?" if close else ""


def cached_snapshot(repository: str, revision: str | None) -> Path | None:
    """The folder of `repository` at `revision` in the Hugging Face cache, if its
    configuration is there."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repository, "config.json", revision=revision)
    return Path(found).parent if isinstance(found, str) else None


def not_found(source: str, revision: str | None, error: BaseException) -> ModelError:
    """The one-line reason why the hub id `source` (`revision`) cannot be read, from the
    error the Hub client raised."""
    from huggingface_hub.errors import (
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if isinstance(error, RevisionNotFoundError):
        return ModelError(
            f"model '{source}' on the Hugging Face Hub has no revision '{revision}': name a "
            "branch, tag or commit it has"
        )
    if isinstance(error, RepositoryNotFoundError):
        return ModelError(
            f"unknown model '{source}': not a bundled recipe, not a local folder, and not on "
            f"the Hugging Face Hub (or private: log in with `hf auth login`){did_you_mean(source)}"
        )
    if isinstance(error, LocalEntryNotFoundError):
        return ModelError(
            f"model '{source}' is not in the Hugging Face cache, and the Hub cannot be "
            f"reached (offline){did_you_mean(source)}: run `bulkembed pull {source}` where "
            "the Hub can be reached, or pass a local folder"
        )
    return ModelError(
        f"cannot read model '{source}' from the Hugging Face Hub or its cache "
        f"({type(error).__name__}){did_you_mean(source)}"
    )


def pull(name: str, revision: str | None = None) -> tuple[str, str | None, Path]:
    """Download what a run reads of the recipe or hub id `name` (at `revision`, else the
    recipe's) into the Hugging Face cache: its hub id, revision and snapshot folder."""
    from huggingface_hub import list_repo_files, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    from bulkembed.models.recipes import find_recipe

    recipe = find_recipe(name)
    repository = recipe.model if recipe is not None else name
    revision = revision or (recipe.revision if recipe is not None else None)
    if looks_like_a_path(name) or Path(name).expanduser().exists():
        raise UsageError(f"pull: {name} is a path; pull takes a recipe or a hub id (org/name)")
    skipped = list(_SKIPPED)
    try:
        files = list_repo_files(repository, revision=revision)
    except (HfHubHTTPError, LocalEntryNotFoundError) as e:
        raise not_found(repository, revision, e) from e
    except _unreachable() as e:
        # The Hub cannot be reached: what the cache holds already is all there is.
        cached = cached_snapshot(repository, revision)
        if cached is None:
            raise not_found(repository, revision, LocalEntryNotFoundError(str(e))) from e
        return repository, revision, cached
    if any(f.endswith(".safetensors") for f in files):
        skipped += ["pytorch_model*.bin", "*/pytorch_model*.bin"]
    try:
        folder = snapshot_download(repository, revision=revision, ignore_patterns=skipped)
    except (HfHubHTTPError, LocalEntryNotFoundError) as e:
        raise not_found(repository, revision, e) from e
    except _unreachable() as e:
        raise not_found(repository, revision, LocalEntryNotFoundError(str(e))) from e
    return repository, revision, Path(folder)


def _unreachable() -> tuple[type[BaseException], ...]:
    """The errors of a request that did not reach the Hub (offline mode, no network), for
    the HTTP library the installed `huggingface_hub` uses."""
    errors: list[type[BaseException]] = [OSError]
    for module in ("httpx2", "httpx", "requests"):
        try:
            imported = __import__(module)
        except ImportError:
            continue
        base = getattr(imported, "TransportError", None) or getattr(
            imported, "RequestException", None
        )
        if isinstance(base, type) and issubclass(base, BaseException):
            errors.append(base)
    return tuple(errors)

"""Files of a model: from its local folder, or from the Hugging Face Hub and its cache."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from bulkembed.errors import ModelError
from bulkembed.models.file_digests import file_digests
from bulkembed.models.hub import looks_like_a_path, not_found

_COMMIT = re.compile(r"[0-9a-f]{40}")

# A local folder's version: a digest of every byte of its files (`file_digests`).
FOLDER_DIGEST = "sha256-whole:"
# The weights of BGE-M3's sparse and ColBERT heads, beside the transformer's.
BGE_M3_HEAD_FILES = ("sparse_linear.pt", "colbert_linear.pt")


def is_local(source: str) -> bool:
    return Path(source).expanduser().is_dir()


def exact_files(source: str, version: str) -> bool:
    """Whether `version` (`model_version`) names the model's files exactly: a local folder's
    digest or a hub commit, not a branch, whose files may change under its name."""
    return is_local(source) or _COMMIT.fullmatch(version) is not None


def model_file(source: str, revision: str | None, filename: str) -> Path | None:
    """A model file from its folder or the Hugging Face Hub (or its cache); None if absent."""
    if is_local(source):
        path = Path(source).expanduser() / filename
        return path if path.is_file() else None
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import LocalEntryNotFoundError, RemoteEntryNotFoundError

    try:
        return Path(hf_hub_download(source, filename, revision=revision))
    except RemoteEntryNotFoundError:
        return None
    except LocalEntryNotFoundError:
        # Offline, and the file was never cached: optional files are then taken as absent;
        # `find_model_config` has already failed if the model itself is not cached.
        if filename == "config.json":
            raise
        return None


def model_version(source: str, revision: str | None, config_file: Path) -> str:
    """What identifies these exact weights: the hub commit (the hub names a commit's files
    by their hashes), or a digest of the local folder.

    The folder digest covers every file's name, and every byte of its content
    (`file_digests`: remembered per file, so that an unchanged folder costs a stat per
    file, not a reading). Hidden files and READMEs do not count. Versions recorded before
    it (`sha256:` and 16 digits) digested the first and last MiB of each file only: they
    equal no version now, so their outputs are taken as made with other weights."""
    if not is_local(source):
        if config_file.parent.parent.name == "snapshots":
            return config_file.parent.name
        return revision or "main"
    folder = Path(source)
    files = sorted(
        p
        for p in folder.rglob("*")
        if p.is_file()
        and not p.name.upper().startswith("README")
        and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    )
    digest = hashlib.sha256()
    for path, content in zip(files, file_digests(files), strict=True):
        digest.update(f"{path.relative_to(folder).as_posix()}\0{content}\0".encode())
    return f"{FOLDER_DIGEST}{digest.hexdigest()[:32]}"


def read_json(path: Path | None) -> Any:
    """The JSON value in `path` (None when there is no file)."""
    if path is None:
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ModelError(f"cannot read {path}: {e}") from e


def find_model_config(source: str, revision: str | None, recipe: str | None = None) -> Path:
    """The model's config.json; a clear error when the model cannot be found (naming the
    bundled `recipe` whose weights `source` is, if one is)."""
    if is_local(source):
        found = model_file(source, revision, "config.json")
        if found is None:
            raise ModelError(
                f"model folder {source} has no config.json: is it a transformers model?"
            )
        return found
    if Path(source).expanduser().exists():
        raise ModelError(f"--model {source} is a file; pass a model folder, a hub id or a recipe")
    if looks_like_a_path(source):
        raise ModelError(
            f"no such folder: {source} (a model folder holds config.json); pass a folder that "
            "exists, a recipe or a hub id"
        )
    try:
        found = model_file(source, revision, "config.json")
    except (OSError, ValueError) as e:
        if recipe is not None:
            raise ModelError(
                f"the weights of recipe '{recipe}' ({source}) are not in the Hugging Face "
                f"cache and cannot be fetched from the Hub ({type(e).__name__}): run "
                f"`bulkembed pull {recipe}` where the Hub can be reached, or pass a local "
                f"copy: --model FOLDER --recipe {recipe}"
            ) from e
        raise not_found(source, revision, e) from e
    if found is None:
        raise ModelError(f"model {source} on the Hugging Face Hub has no config.json")
    return found

"""The fingerprint of a run: the settings that decide what its output holds, checked on
resume. Each setting is listed once, with the name the user knows it by, so the fingerprint
and the description of what changed cannot drift apart."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bulkembed.sources.reader import DEFAULT_ID_COLUMN
from bulkembed.storage import is_uri, location

if TYPE_CHECKING:
    from bulkembed.config import RunConfig
    from bulkembed.models.model_spec import ModelSpec
    from bulkembed.sources import InputFile


@dataclass(frozen=True, slots=True)
class _Setting:
    """A fingerprint setting: its name for the user, and its value for a run; `unset` is
    the value that None stands for (an option left out that means the same as a value)."""

    name: str
    value: Callable[[RunConfig, ModelSpec, list[InputFile]], Any]
    unset: Any = None


def _since(since: str | None) -> str | None:
    """`--since` as an absolute path, or the URI as given."""
    if since is None:
        return None
    return str(location(since)) if is_uri(since) else str(Path(since).resolve())


def _inputs(config: RunConfig, spec: ModelSpec, files: list[InputFile]) -> list[dict[str, Any]]:
    """Each input by name, size and modification time, and with `--verify-inputs` a digest
    of its content."""
    from bulkembed.sources import format_of
    from bulkembed.sources.opening import content_digest

    found = []
    for file in files:
        entry: dict[str, Any] = {"name": file.name, "size": file.size, "modified": file.modified}
        if config.inputs.verify_inputs and file.members:
            # An image folder: the digest of its images' digests, in order.
            digests = [content_digest(file.path / name) for name in file.members]
            entry["content"] = hashlib.blake2b(
                "".join(digests).encode(), digest_size=16
            ).hexdigest()
        elif config.inputs.verify_inputs and not format_of(file).streamed:
            entry["content"] = content_digest(file.path)
        found.append(entry)
    return found


SETTINGS: dict[str, _Setting] = {
    # How inputs are cut into units: done markers name units by number.
    "units": _Setting(
        "--records-per-unit",
        lambda c, s, f: f"parquet row groups; {c.inputs.records_per_unit} jsonl lines",
    ),
    # A local model counts by its folder's name and content, so a folder that moved resumes.
    "model": _Setting("--model", lambda c, s, f: Path(s.source).name if s.local else s.source),
    "model_version": _Setting("the model's weights", lambda c, s, f: s.version),
    "family": _Setting("model family", lambda c, s, f: s.family),
    "outputs": _Setting("--outputs", lambda c, s, f: list(s.outputs)),
    "sparse_top_k": _Setting("--sparse-top-k", lambda c, s, f: s.sparse_top_k),
    "dim": _Setting("--dim", lambda c, s, f: c.model.dim),
    "dtype_out": _Setting("--dtype-out", lambda c, s, f: c.model.dtype_out.value),
    "quantize": _Setting("--quantize", lambda c, s, f: c.model.quantize and c.model.quantize.value),
    "pooling": _Setting("--pooling", lambda c, s, f: s.pooling.value if s.pooling else None),
    "normalize": _Setting("--normalize", lambda c, s, f: s.normalize),
    "max_length": _Setting("--max-length", lambda c, s, f: s.max_length),
    "prompt": _Setting("--prompt", lambda c, s, f: s.prompt),
    "lowercase": _Setting("lowercasing", lambda c, s, f: s.lowercase),
    # As given: with `auto` a run may resume on another kind of device.
    "dtype": _Setting("--dtype", lambda c, s, f: c.batching.dtype.value),
    # But int8 and float vectors are never mixed: the int8 dtype a run tries (`--dtype
    # auto` tries int8-weights on CPUs without bfloat16) is part of what it writes.
    "int8": _Setting("--dtype's int8", lambda c, s, f: s.int8),
    "text_column": _Setting("--text-column", lambda c, s, f: c.inputs.text_column),
    "image_column": _Setting("--image-column", lambda c, s, f: c.inputs.image_column),
    # How images are decoded, resized and cropped: the model's processor's settings.
    "image": _Setting("the model's image preprocessing", lambda c, s, f: _image(s)),
    # Left out, the id column is `id` where the inputs have one: the same setting.
    "id_column": _Setting("--id-column", lambda c, s, f: c.inputs.id_column, DEFAULT_ID_COLUMN),
    "limit": _Setting("--limit", lambda c, s, f: c.inputs.limit),
    "inputs": _Setting("the inputs", _inputs),
    "keep_columns": _Setting("--keep-columns", lambda c, s, f: list(c.output.keep_columns)),
    "since": _Setting("--since", lambda c, s, f: _since(c.run.since)),
}


def _image(spec: ModelSpec) -> dict[str, Any] | None:
    """The model's image preprocessing as its JSON reads back (None: it reads texts)."""
    return None if spec.image is None else json.loads(json.dumps(asdict(spec.image)))


def fingerprint(config: RunConfig, spec: ModelSpec, files: list[InputFile]) -> dict[str, Any]:
    """The settings that decide what the output holds. A run resumes only if they match."""
    return {
        key: _normal(key, setting.value(config, spec, files)) for key, setting in SETTINGS.items()
    }


def _normal(key: str, value: Any) -> Any:
    """A setting's value, None standing for the value it means."""
    return SETTINGS[key].unset if value is None and key in SETTINGS else value


def describe_changes(before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """One phrase per fingerprint setting that differs, e.g. `--max-length: 256 -> 128`."""
    changes = []
    for key in sorted(set(before) | set(now)):
        name = SETTINGS[key].name if key in SETTINGS else key
        if key == "inputs":
            change = _inputs_change(before.get(key) or [], now.get(key) or [])
            if change is not None:
                changes.append(f"{name} ({change})")
        else:
            old, new = _normal(key, before.get(key)), _normal(key, now.get(key))
            if old != new:
                changes.append(f"{name}: {old!r} -> {new!r}")
    return changes


def _inputs_change(before: list[dict[str, Any]], now: list[dict[str, Any]]) -> str | None:
    """How the inputs differ, or None. An input is the same when its name and size are, and
    its content digest (`--verify-inputs`, when both runs took one), else its modification
    time."""
    if [(i["name"], i["size"]) for i in before] != [(i["name"], i["size"]) for i in now]:
        return "files added, removed or changed in size"
    for old, new in zip(before, now, strict=True):
        if "content" in old and "content" in new:
            if old["content"] != new["content"]:
                return f"{new['name']} changed in content"
        elif old.get("modified") != new.get("modified"):
            return (
                f"{new['name']} was modified after the output was started; a run started with "
                "--verify-inputs compares contents instead of times"
            )
    return None

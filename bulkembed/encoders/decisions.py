"""What a run found out about a model on a device, kept for the next run with the same key:
the `--dtype auto` check (`precision`), the memory a token of a batch takes (the budget
probe, `runtime.measure_budget`) and the fastest attention kernel (`kernels`).

Each decision is a small JSON file in the export cache, `<kind>/<digest of the key>.json`.
A key (`device_key`) names the device (a CPU's model name and flags, a GPU's name and
compute capability), the dtype, and the versions of bulkembed, PyTorch, OpenVINO and
transformers, and each kind adds what its finding depends on (the whole `ModelSpec`, an
attention shape). A change of any part of the key finds nothing and decides again, and so
does removing the folder; a file that cannot be read or written counts as none.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bulkembed.models.devices import device_identity
from bulkembed.models.export_cache import installed_version, key_digest
from bulkembed.models.file_digests import cache_root
from bulkembed.models.model_files import exact_files
from bulkembed.version import __version__

if TYPE_CHECKING:
    import torch

    from bulkembed.models.model_spec import ModelSpec


def device_key(device: str, dtype: torch.dtype) -> dict[str, Any]:
    """What every decision depends on: the device, the dtype and the libraries' versions."""
    return {
        "device": device_identity(device),
        "dtype": str(dtype),
        "bulkembed": __version__,
        **{name: installed_version(name) for name in ("torch", "openvino", "transformers")},
    }


def model_key(spec: ModelSpec, device: str, dtype: torch.dtype) -> dict[str, Any] | None:
    """`device_key` and the model's settings and exact files (the whole `spec`); None where
    its files are not pinned (a hub branch may change under its name: nothing recorded
    holds for it)."""
    if not exact_files(spec.source, spec.version):
        return None
    # Whether this run probes its budget is not the model's: a probe recorded by a run
    # with an `auto` budget serves a run that probes for flat batches, and back.
    fields = {k: v for k, v in asdict(spec).items() if k != "probe_budget"}
    settings = json.dumps(fields, sort_keys=True, default=str)
    return {"spec": hashlib.sha256(settings.encode()).hexdigest(), **device_key(device, dtype)}


def decision_path(kind: str, key: dict[str, Any]) -> Path:
    """Where the decision of `kind` under `key` is kept."""
    return cache_root() / kind / f"{key_digest(key)}.json"


def read_decision(kind: str, key: dict[str, Any] | None) -> dict[str, Any] | None:
    """The decision of `kind` recorded under `key`, or None (none, unreadable, no key)."""
    if key is None:
        return None
    try:
        found = json.loads(decision_path(kind, key).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def record_decision(kind: str, key: dict[str, Any] | None, found: dict[str, Any]) -> None:
    """Keep `found` under `key` for later runs (replacing it whole, never half-written);
    nothing where there is no key or the cache cannot be written."""
    if key is None:
        return
    path = decision_path(kind, key)
    # Unique across the hosts that share a cache folder.
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_text(json.dumps(found), encoding="utf-8")
        temporary.replace(path)
    except OSError:
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)

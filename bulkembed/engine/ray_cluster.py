"""The Ray cluster of `--engine ray`: joining it (or starting a local one), and the actors
it runs the model on."""

from __future__ import annotations

import logging
from typing import Any

from bulkembed.errors import BulkembedError, UsageError
from bulkembed.wording import counted


def connect(address: str | None) -> bool:
    """Join the cluster at `address` (default: `auto`, a running one), or the one this
    process is already connected to; without one, start a local instance. True when this
    process started it (and must stop it)."""
    import ray

    if ray.is_initialized():
        return False
    options: dict[str, Any] = {"logging_level": logging.ERROR, "log_to_driver": False}
    if address is not None:
        try:
            ray.init(address=address, **options)
        except (ConnectionError, ValueError) as e:
            raise BulkembedError(f"--ray-address {address}: cannot join the cluster: {e}") from e
        return False
    try:
        ray.init(address="auto", **options)
        return False
    except ConnectionError:
        ray.init(include_dashboard=False, **options)
        return True


def actors(devices: str) -> tuple[str, int, int]:
    """(device, actors, threads per actor) on the cluster: `auto` takes every GPU, else one
    CPU actor; `cpu,cpu` or `cuda:0,cuda:1` ask for that many actors of the kind. A CPU
    actor takes the CPUs of the largest node but one, shared among the actors, so that the
    tokenizing tasks always have a CPU."""
    import ray

    gpus = int(ray.cluster_resources().get("GPU", 0))
    node_cpus = max(
        (int(n["Resources"].get("CPU", 0)) for n in ray.nodes() if n.get("Alive")), default=1
    )
    entries = [d.strip() for d in devices.split(",") if d.strip()]
    if entries == ["auto"]:
        entries = ["cuda"] * gpus or ["cpu"]
    kinds = {"cpu" if d == "cpu" else "cuda" if d.startswith("cuda") else d for d in entries}
    if len(kinds) != 1 or not kinds <= {"cpu", "cuda"}:
        raise UsageError(
            f"--devices {devices} with --engine ray: pass auto, or a list of cpu or of cuda "
            "entries (one actor each)"
        )
    device = kinds.pop()
    if device == "cuda" and gpus < len(entries):
        raise UsageError(
            f"--devices {devices}: the Ray cluster has {counted(gpus, 'GPU')}; pass --devices auto"
        )
    if device == "cpu" and len(entries) > max(1, node_cpus - 1):
        raise UsageError(
            f"--devices {devices}: {len(entries)} CPU actors need {len(entries) + 1} CPUs on "
            f"one node (one for the tokenizing tasks), and the largest has {node_cpus}"
        )
    threads = max(1, (node_cpus - 1) // len(entries)) if device == "cpu" else 1
    return device, len(entries), threads

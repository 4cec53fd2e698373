"""The encoder registry: the class of each model family, and how an encoder starts.

Built-in families are imported only when first used, so that importing bulkembed does not
import torch. Tests and plugins add families with `register_encoder`.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING

from bulkembed.errors import ModelError

if TYPE_CHECKING:
    import torch

    from bulkembed.encoders.base import Encoder
    from bulkembed.models.model_spec import ModelSpec

_BUILT_IN = {
    "dense": "bulkembed.encoders.dense:DenseEncoder",
    "bge-m3": "bulkembed.encoders.bge_m3:BGEM3Encoder",
    "splade": "bulkembed.encoders.splade:SpladeEncoder",
    "colbert": "bulkembed.encoders.colbert:ColbertEncoder",
    "clip": "bulkembed.encoders.clip:ClipEncoder",
}
_REGISTRY: dict[str, type[Encoder]] = {}
# CPU threads of a process that feeds a CUDA device.
CUDA_FEEDER_THREADS = 2


def register_encoder(family: str, encoder: type[Encoder]) -> None:
    """Make `family` (as named in recipes) build `encoder`."""
    _REGISTRY[family] = encoder


def _lookup(family: str) -> type[Encoder]:
    if family not in _REGISTRY and family in _BUILT_IN:
        module, name = _BUILT_IN[family].split(":")
        register_encoder(family, getattr(importlib.import_module(module), name))
    if family not in _REGISTRY:
        known = ", ".join(sorted(set(_BUILT_IN) | set(_REGISTRY)))
        raise ModelError(f"unknown model family '{family}' (known: {known})")
    return _REGISTRY[family]


def build_encoder(spec: ModelSpec, device: str, dtype: torch.dtype) -> Encoder:
    """The encoder for `spec.family`, loaded on `device`."""
    return _lookup(spec.family)(spec, device, dtype)


def start_encoder(
    spec: ModelSpec, device: str, dtype: torch.dtype, threads: int | None
) -> tuple[Encoder, int | None]:
    """The encoder of `spec` on `device`, and where it probes (`tunes_budget`) the token
    budget that fills the device's memory (`Encoder.measure_budget`; None where memory
    does not bound batches). `threads` caps torch's threads on a CPU shared with other
    encoders. The local engine, each worker of the several-devices pool and each Ray actor
    start encoders here."""
    import torch

    from bulkembed.models.devices import allow_tensor_cores, keep_memory_flat

    if device == "cpu" and threads is not None:
        torch.set_num_threads(threads)
    if device.startswith("cuda"):
        # Kernels and allocations of this process default to its own device; its CPU work
        # (padding, pinning) needs few threads, and the cores go to the tokenizers.
        torch.cuda.set_device(device)
        torch.set_num_threads(CUDA_FEEDER_THREADS)
    allow_tensor_cores(device, dtype)
    keep_memory_flat()
    encoder = build_encoder(spec, device, dtype)
    return encoder, encoder.measure_budget() if tunes_budget(encoder) else None


FLAT_BUDGET_VARIABLE = "BULKEMBED_FLAT_BUDGET"


def tunes_budget(encoder: Encoder) -> bool:
    """Whether `encoder` probes the token budget that fills its device
    (`Encoder.measure_budget`, at most `MAX_MEASURED_BUDGET`): where the spec asks for a
    probe (`ModelSpec.probe_budget`, an `auto` budget), and for flat batches on CUDA under a
    budget nobody gave (the recipe's or the default). A flat batch pays no padding and no
    mask for its size, and its matrix multiplies grow with it;
    `BULKEMBED_FLAT_BUDGET=recipe` keeps the recipe's budget."""
    if encoder.spec.probe_budget:
        return True
    if os.environ.get(FLAT_BUDGET_VARIABLE, "tuned").lower() == "recipe":
        return False
    cuda = encoder.device.startswith("cuda")
    return cuda and encoder.unpadded and not encoder.spec.budget_given


def read_ahead_budget(spec: ModelSpec, device: str, dtype: str) -> int:
    """The budget a run reads ahead by before its model loads: where it will probe its
    budget (`ModelSpec.probe_budget`, or flat batches on CUDA under a budget nobody gave,
    as `tunes_budget` decides once the model is loaded; the layout as `choose_attention`
    expects it), the one an earlier run's probe found on this device
    (`runtime.recorded_budget`); else the spec's."""
    import torch

    from bulkembed.config import Attention
    from bulkembed.encoders.backend import choose_attention
    from bulkembed.encoders.runtime import recorded_budget

    if not device.startswith("cuda"):
        return spec.budget
    flat = choose_attention(spec, device, getattr(torch, dtype))[0] is Attention.FLAT
    tuned = os.environ.get(FLAT_BUDGET_VARIABLE, "tuned").lower() != "recipe"
    if spec.probe_budget or (flat and tuned and not spec.budget_given):
        return recorded_budget(spec, device, dtype) or spec.budget
    return spec.budget

"""Attention kernels timed side by side on one window of documents: the attention check of
`gpu_check.py`.

The documents' lengths are sorted as a window sorts them and cut into batches of at most
`budget` padded tokens (rows × the longest row); every implementation gets the same batches
and the same random queries, keys and values ([tokens, heads, head size]):

- flat, over `cu_seqlens`: each kernel of `bulkembed.encoders.kernels` that runs on the
  device (`varlen_attn`, `flash-attention-3`, `flash-attn-2`, `cudnn-jagged`), and
  `jagged_<backend>` (scaled-dot-product attention on a jagged nested tensor, the backend
  forced: flash, efficient);
- padded to each batch's longest document, with the key-padding mask a padded batch takes:
  `padded_mask` (the backend PyTorch picks, as a padded model runs), `padded_mask_<backend>`
  (forced: efficient, cudnn);
- `reference`: `varlen.reference_attention`, one call per run of equal lengths.

Each one runs every batch twice: the first pass meets each batch shape for the first time
(a kernel library that builds a plan per shape pays for it there), the second does not.
Reported per implementation: the wall seconds of each pass, the second pass's attention
TFLOP/s (4 · heads · head size · Σ length² per batch, real tokens only), and its error
against the reference in float32 (‖out − ref‖ / ‖ref‖ over the real tokens of the first
batches); an implementation that does not run says why. The matrix multiplies of one
layer of the model (`linear_shapes`) are timed at `budget` tokens for their own TFLOP/s.
On CUDA, the kernels that the default padded call launched are named (PyTorch's profiler).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from bulkembed.encoders import kernels, varlen

# Batches whose outputs are compared with the reference (the rest are only timed).
_COMPARED = 2
# Matrix products timed per shape, after as many warm-up products.
_PRODUCTS = 20


@dataclass(frozen=True, slots=True)
class Batch:
    """One batch of documents, in each layout an implementation takes."""

    lengths: np.ndarray
    flat: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    sequences: varlen.Sequences
    offsets: torch.Tensor

    @property
    def tokens(self) -> int:
        return int(self.lengths.sum())

    def padded(self) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        """Queries, keys and values as [documents, heads, longest, head size], zero past
        each document's end, and the key-padding mask [documents, 1, 1, longest]."""
        rows, longest = len(self.lengths), int(self.lengths.max())
        _, heads, size = self.flat[0].shape
        where = _padded_index(self.lengths, longest, self.flat[0].device)
        laid = []
        for part in self.flat:
            padded = part.new_zeros(rows * longest, heads, size)
            padded[where] = part
            laid.append(padded.view(rows, longest, heads, size).transpose(1, 2))
        mask = torch.zeros(rows * longest, dtype=torch.bool, device=where.device)
        mask[where] = True
        return tuple(laid), mask.view(rows, 1, 1, longest)


def _padded_index(lengths: np.ndarray, longest: int, device: torch.device) -> torch.Tensor:
    """Each real token's place in the batch padded to `longest`."""
    rows = np.repeat(np.arange(len(lengths)), lengths)
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    places = rows * longest + np.arange(int(lengths.sum())) - starts
    return torch.from_numpy(places).to(device)


def window_batches(lengths: np.ndarray, budget: int) -> list[np.ndarray]:
    """`lengths` sorted longest first, cut into batches of at most `budget` padded tokens
    (a document longer than the budget is a batch alone).

    >>> [b.tolist() for b in window_batches(np.array([3, 9, 4, 2, 2]), 10)]
    [[9], [4, 3], [2, 2]]
    """
    batches: list[list[int]] = []
    for length in sorted((int(n) for n in lengths), reverse=True):
        if batches and (len(batches[-1]) + 1) * batches[-1][0] <= budget:
            batches[-1].append(length)
        else:
            batches.append([length])
    return [np.array(b, dtype=np.int64) for b in batches]


def _batch(lengths: np.ndarray, heads: int, size: int, device: str, dtype: Any) -> Batch:
    tokens = int(lengths.sum())
    flat = tuple(torch.randn(tokens, heads, size, device=device, dtype=dtype) for _ in "qkv")
    sequences = varlen.Sequences.on_host(lengths).to(lambda t: t.to(device))
    offsets = sequences.cu_seqlens.long()
    return Batch(lengths, (flat[0], flat[1], flat[2]), sequences, offsets)


Implementation = Callable[[Batch], Callable[[], torch.Tensor]]


def _reference(batch: Batch) -> Callable[[], torch.Tensor]:
    return lambda: varlen.reference_attention(*batch.flat, batch.sequences)


def _flat_kernel(name: str) -> Implementation:
    def prepared(batch: Batch) -> Callable[[], torch.Tensor]:
        cu, longest = batch.sequences.cu_seqlens, batch.sequences.longest

        def run() -> torch.Tensor:
            out = kernels.call(name, *batch.flat, cu, longest, False, kernels.FULL)
            assert out is not None
            return out

        return run

    return prepared


def _jagged(backend: SDPBackend) -> Implementation:
    def prepared(batch: Batch) -> Callable[[], torch.Tensor]:
        longest = int(batch.lengths.max())
        nested = [
            torch.nested.nested_tensor_from_jagged(
                part, batch.offsets, max_seqlen=longest, min_seqlen=int(batch.lengths.min())
            ).transpose(1, 2)
            for part in batch.flat
        ]

        def run() -> torch.Tensor:
            with sdpa_kernel(backend):
                out = F.scaled_dot_product_attention(*nested)
            return out.transpose(1, 2).values()

        return run

    return prepared


def _padded(backend: SDPBackend | None) -> Implementation:
    def prepared(batch: Batch) -> Callable[[], torch.Tensor]:
        (q, k, v), mask = batch.padded()
        where = _padded_index(batch.lengths, q.shape[2], q.device)

        def attend() -> torch.Tensor:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

        def run() -> torch.Tensor:
            if backend is None:
                out = attend()
            else:
                with sdpa_kernel(backend):
                    out = attend()
            rows, heads, longest, size = out.shape
            return out.transpose(1, 2).reshape(rows * longest, heads, size)[where]

        return run

    return prepared


def implementations(device: str, dtype: Any) -> dict[str, Implementation]:
    """The implementations that may run on `device` in `dtype` (each may still refuse a
    batch)."""
    found: dict[str, Implementation] = {"reference": _reference}
    if not device.startswith("cuda"):
        found["padded_mask"] = _padded(None)
        return found
    for name in kernels.available(device, dtype):
        found[name] = _flat_kernel(name)
    for name, backend in (
        ("flash", SDPBackend.FLASH_ATTENTION),
        ("efficient", SDPBackend.EFFICIENT_ATTENTION),
    ):
        found[f"jagged_{name}"] = _jagged(backend)
    found["padded_mask"] = _padded(None)
    found["padded_mask_efficient"] = _padded(SDPBackend.EFFICIENT_ATTENTION)
    found["padded_mask_cudnn"] = _padded(SDPBackend.CUDNN_ATTENTION)
    return found


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def _timed_pass(runs: list[Callable[[], torch.Tensor]], device: str) -> float:
    _synchronize(device)
    started = time.perf_counter()
    for run in runs:
        run()
    _synchronize(device)
    return time.perf_counter() - started


def _error(out: torch.Tensor, reference: torch.Tensor) -> float:
    difference = torch.linalg.vector_norm(out.float() - reference)
    return float(difference / torch.linalg.vector_norm(reference))


def _attention_flops(batches: list[Batch], heads: int, size: int) -> float:
    return float(sum(4 * heads * size * int((b.lengths**2).sum()) for b in batches))


def _measure_one(
    implementation: Implementation,
    batches: list[Batch],
    references: list[torch.Tensor],
    device: str,
) -> dict[str, Any]:
    try:
        runs = [implementation(batch) for batch in batches]
        first = _timed_pass(runs, device)
        second = _timed_pass(runs, device)
        error = max(_error(run(), ref) for run, ref in zip(runs, references, strict=False))
    except Exception as e:  # an implementation that does not run is reported, not fatal
        return {"runs": False, "why": str(e).splitlines()[0][:200]}
    return {"runs": True, "first_pass_s": round(first, 4), "second_pass_s": round(second, 4)} | {
        "error": float(f"{error:.3g}")
    }


def _linear_rates(
    shapes: list[tuple[int, int]], tokens: int, device: str, dtype: Any
) -> dict[str, Any]:
    """TFLOP/s of `tokens` × (in, out) matrix products with a bias, each shape and all."""
    rates, flops, seconds = {}, 0.0, 0.0
    for width_in, width_out in shapes:
        x = torch.randn(tokens, width_in, device=device, dtype=dtype)
        w = torch.randn(width_out, width_in, device=device, dtype=dtype) / width_in**0.5
        b = torch.randn(width_out, device=device, dtype=dtype)
        for _ in range(_PRODUCTS):
            F.linear(x, w, b)
        _synchronize(device)
        started = time.perf_counter()
        for _ in range(_PRODUCTS):
            F.linear(x, w, b)
        _synchronize(device)
        spent = (time.perf_counter() - started) / _PRODUCTS
        done = 2.0 * tokens * width_in * width_out
        rates[f"{width_in}x{width_out}"] = round(done / spent / 1e12, 2)
        flops, seconds = flops + done, seconds + spent
    rates["all"] = round(flops / seconds / 1e12, 2)
    return rates


def _padded_kernels(batch: Batch) -> list[str]:
    """The CUDA kernels the default padded call with a mask launched, busiest first."""
    from torch.profiler import ProfilerActivity, profile

    run = _padded(None)(batch)
    run()
    with profile(activities=[ProfilerActivity.CUDA]) as profiled:
        run()
        torch.cuda.synchronize()
    events = sorted(profiled.key_averages(), key=lambda e: -e.device_time_total)
    return [e.key[:120] for e in events[:4]]


def measure(
    lengths: np.ndarray,
    heads: int,
    size: int,
    budget: int,
    device: str,
    dtype: Any,
    linear_shapes: list[tuple[int, int]],
) -> dict[str, Any]:
    """Every implementation of `implementations(device, dtype)` on the documents of `lengths`
    cut into batches of `budget` padded tokens (see the module's docstring)."""
    torch.manual_seed(0)
    batches = [_batch(b, heads, size, device, dtype) for b in window_batches(lengths, budget)]
    upcast = [
        varlen.reference_attention(*(p.float() for p in b.flat), b.sequences)
        for b in batches[:_COMPARED]
    ]
    flops = _attention_flops(batches, heads, size)
    padded = sum(b.tokens for b in batches) / sum(len(b.lengths) * b.lengths.max() for b in batches)
    figures: dict[str, Any] = {
        "batches": len(batches),
        "tokens": sum(b.tokens for b in batches),
        "padding_efficiency": round(float(padded), 3),
        "attention_gflop": round(flops / 1e9, 1),
    }
    for name, implementation in implementations(device, dtype).items():
        measured = _measure_one(implementation, batches, upcast, device)
        if measured["runs"]:
            measured["attention_tflops"] = round(flops / measured["second_pass_s"] / 1e12, 2)
        figures[name] = measured
    figures["linear_tflops"] = _linear_rates(linear_shapes, budget, device, dtype)
    if device.startswith("cuda"):
        figures["padded_mask_kernels"] = _padded_kernels(batches[len(batches) // 2])
    return figures

"""Variable-length attention: the tokens of several documents laid end to end, each token
attending to the tokens of its own document only.

Queries, keys and values are [tokens, heads, head size]; `Sequences` says where each
document starts (`cu_seqlens`, as flash-attention names it: 0, then the running total of the
lengths). Nothing is padded and no [documents, length, length] mask exists.

Two implementations give the same result:
- `kernel_attention`: one call of a CUDA flash kernel over `cu_seqlens`, for float16 and
  bfloat16 on CUDA: on a Hopper GPU (compute capability 9.x) flash-attention 3's
  `flash_attn_interface.flash_attn_varlen_func` where it is installed, unless
  `BULKEMBED_FLASH_ATTENTION=fa2`; else PyTorch's `torch.nn.attention.varlen.varlen_attn`,
  else flash-attn's (2) `flash_attn_varlen_func`;
- `reference_attention`: PyTorch's scaled-dot-product attention on each run of documents of
  one length, stacked without padding (masked only for a local window). It runs on any
  device and dtype, and is what the tests check the flat path with on the CPU.

Both take a causal flag (decoders), a local window (ModernBERT's local layers, Mistral's
sliding window) and keys and values with fewer heads than queries (grouped-query attention).
A kernel that cannot mask as asked (PyTorch 2.9's has no window) leaves the call to the
reference.

`varlen_attention` calls them through one custom operator, `bulkembed::varlen_attention`,
which picks the kernel where it runs and the reference elsewhere: `torch.compile` sees one
opaque call of known output shape, so a compiled flat layer has no graph break, whichever
implementation runs.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

_HALF = (torch.float16, torch.bfloat16)

# A local attention window: how many tokens before and after a token it attends to (-1: no
# bound), as the flash kernels take it.
Window = tuple[int, int]
FULL: Window = (-1, -1)


@dataclass(frozen=True, slots=True)
class Sequences:
    """Where each document's tokens are in a flat batch.

    - `cu_seqlens`: [documents + 1] int32 on the device: where each document starts, then
      the total;
    - `token_documents`: [tokens] int64 on the device: the document of each token;
    - `longest`, `runs`: the longest document, and (length, count) of each run of equal
      consecutive lengths; plain numbers the host knows, so that no kernel waits on the
      device;
    - `run_table`: `runs` as a [runs, 2] int64 tensor that stays on the host, what the
      custom operator takes (a compiled model sees a tensor of varying size, not numbers
      to specialize on).

    >>> s = Sequences.on_host(np.array([3, 1, 1, 2]))
    >>> s.cu_seqlens.tolist(), s.token_documents.tolist(), s.longest, s.runs
    ([0, 3, 4, 5, 7], [0, 0, 0, 1, 2, 3, 3], 3, ((3, 1), (1, 2), (2, 1)))
    """

    cu_seqlens: torch.Tensor
    token_documents: torch.Tensor
    longest: int
    runs: tuple[tuple[int, int], ...]
    run_table: torch.Tensor

    @classmethod
    def on_host(cls, lengths: np.ndarray) -> Sequences:
        """The sequences of documents of `lengths`, as CPU tensors."""
        lengths = np.asarray(lengths, dtype=np.int64)
        cu_seqlens = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        documents = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
        longest = int(lengths.max()) if len(lengths) else 0
        runs = _runs(lengths)
        table = torch.tensor(runs, dtype=torch.int64).reshape(len(runs), 2)
        return cls(torch.from_numpy(cu_seqlens), torch.from_numpy(documents), longest, runs, table)

    def positions(self) -> torch.Tensor:
        """Each token's place in its document, counted from 0: [tokens] int64 on the device.

        >>> Sequences.on_host(np.array([3, 1, 2])).positions().tolist()
        [0, 1, 2, 0, 0, 1]
        """
        starts = self.cu_seqlens[:-1].long()
        every = torch.arange(len(self.token_documents), device=self.token_documents.device)
        return every - starts[self.token_documents]

    def to(self, move: Callable[[torch.Tensor], torch.Tensor]) -> Sequences:
        """These sequences with their device tensors moved by `move` (`run_table` stays)."""
        moved = (move(self.cu_seqlens), move(self.token_documents))
        return Sequences(*moved, self.longest, self.runs, self.run_table)


@functools.cache
def _torch_kernel() -> Callable[..., Any] | None:
    """PyTorch's varlen flash kernel (2.10 and later)."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


@functools.cache
def _kernel() -> Callable[..., Any] | None:
    """The installed varlen flash kernel of any GPU from Ampere on: PyTorch's, else
    flash-attn's (2)."""
    if _torch_kernel() is not None:
        return _torch_kernel()
    try:
        from flash_attn import flash_attn_varlen_func  # type: ignore[import-not-found]
    except ImportError:
        return None
    return flash_attn_varlen_func


FLASH_ATTENTION_VARIABLE = "BULKEMBED_FLASH_ATTENTION"


@functools.cache
def _flash_attention_3() -> Callable[..., Any] | None:
    """flash-attention 3's varlen kernel: the `flash_attn_interface` module of its Hopper
    build."""
    try:
        from flash_attn_interface import (  # type: ignore[import-not-found]
            flash_attn_varlen_func,
        )
    except ImportError:
        return None
    return flash_attn_varlen_func


def _hopper_kernel() -> Callable[..., Any] | None:
    """flash-attention 3's varlen kernel where it is installed, unless
    `BULKEMBED_FLASH_ATTENTION` is `fa2`."""
    if os.environ.get(FLASH_ATTENTION_VARIABLE, "fa3").lower() == "fa2":
        return None
    return _flash_attention_3()


# Flash attention's kernels run on compute capability 8.0 (Ampere) and later;
# flash-attention 3's on 9.x (Hopper) only.
_FLASH_CAPABILITY = (8, 0)
_HOPPER_MAJOR = 9


def _device_kernel(device: str | torch.device) -> Callable[..., Any] | None:
    """The varlen kernel for a CUDA device: flash-attention 3 on a Hopper GPU where it is
    installed (and not switched off), else the kernel of `_kernel` (on any device)."""
    cuda = torch.device(device).type == "cuda"
    if cuda and torch.cuda.get_device_capability(device)[0] == _HOPPER_MAJOR:
        return _hopper_kernel() or _kernel()
    return _kernel()


def kernel_runs(device: str, dtype: torch.dtype) -> bool:
    """Whether a varlen flash kernel runs attention on `device` in `dtype`: CUDA, half
    precision, a GPU of compute capability 8.0 or later, and flash-attention 3 (on Hopper),
    PyTorch's kernel (in a build with flash attention) or flash-attn installed."""
    if not device.startswith("cuda") or dtype not in _HALF:
        return False
    if torch.cuda.get_device_capability(device) < _FLASH_CAPABILITY:
        return False
    kernel = _device_kernel(device)
    if kernel is None:
        return False
    return kernel is not _torch_kernel() or torch.backends.cuda.is_flash_attention_available()


def kernel_name(device: str, dtype: torch.dtype) -> str:
    """Which implementation computes variable-length attention on `device` in `dtype`, in
    words (what the GPU check reports)."""
    if not kernel_runs(device, dtype):
        return "reference (scaled-dot-product attention per run of lengths)"
    kernel = _device_kernel(device)
    if kernel is _hopper_kernel():
        return "flash-attention 3 (flash_attn_interface)"
    if kernel is _torch_kernel():
        return "PyTorch varlen_attn"
    return "flash-attn 2 (flash_attn_varlen_func)"


def kernel_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    sequences: Sequences,
    causal: bool = False,
    window: Window = FULL,
) -> torch.Tensor:
    """The CUDA kernel's attention: the kernels take (q, k, v, cu_seqlens_q,
    cu_seqlens_k, max_q, max_k) and scale by 1/sqrt(head size); `causal` masks each token
    from the tokens after it, `window` from those farther than (left, right) positions
    away. Keys and values may have fewer heads than queries (grouped-query attention)."""
    attended = _kernel_call(
        query, key, value, sequences.cu_seqlens, sequences.longest, causal, window
    )
    assert attended is not None, "this kernel cannot mask this way: see kernel_masks"
    return attended


def _kernel_call(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu: torch.Tensor,
    longest: int,
    causal: bool,
    window: Window,
) -> torch.Tensor | None:
    """The kernel's attention, or None where it cannot mask as asked."""
    kernel = _device_kernel(query.device)
    assert kernel is not None
    masking = _mask_arguments(kernel, causal, window)
    if masking is None:
        return None
    if key.shape[1] != query.shape[1]:
        if "enable_gqa" in _parameters(kernel):
            masking = {**masking, "enable_gqa": True}
        elif kernel is _torch_kernel():
            key, value = (_repeat_heads(t, query.shape[1]) for t in (key, value))
    attended = kernel(query, key, value, cu, cu, longest, longest, **masking)
    # flash-attention 3 returns (output, log-sum-exp) in some releases.
    output: torch.Tensor = attended[0] if isinstance(attended, tuple) else attended
    return output


@functools.cache
def _parameters(kernel: Callable[..., Any]) -> frozenset[str]:
    return frozenset(inspect.signature(kernel).parameters)


def _mask_arguments(
    kernel: Callable[..., Any], causal: bool, window: Window = FULL
) -> dict[str, Any] | None:
    """How `kernel` is told to mask, or None if it cannot: flash-attn's `causal`, PyTorch's
    `is_causal` (2.9), and a `window_size` of (left, right), where (-1, 0) is causal
    (PyTorch 2.10 on, which has no `is_causal`)."""
    parameters = _parameters(kernel)
    arguments: dict[str, Any] = {}
    if causal and "causal" in parameters:
        arguments["causal"] = True
    elif causal and "is_causal" in parameters:
        arguments["is_causal"] = True
    if window != FULL or (causal and not arguments):
        if "window_size" not in parameters:
            return None
        arguments["window_size"] = (window[0], 0 if causal else window[1])
    return arguments


def _repeat_heads(tensor: torch.Tensor, heads: int) -> torch.Tensor:
    """Keys or values [tokens, groups, size] with each group's head repeated for the
    `heads` query heads it serves."""
    return tensor.repeat_interleave(heads // tensor.shape[1], dim=1)


def reference_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    sequences: Sequences,
    causal: bool = False,
    window: Window = FULL,
) -> torch.Tensor:
    """Attention within each document, one scaled-dot-product call per run of consecutive
    documents of one length (a length-sorted batch has few): stacked as [documents, heads,
    length, head size], with no padding, and no mask but the causal or window one where
    asked."""
    return _reference(query, key, value, sequences.runs, causal, window)


def _reference(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    runs: Iterable[tuple[int, int] | list[int]],
    causal: bool,
    window: Window,
) -> torch.Tensor:
    output = torch.empty_like(query)
    tokens, heads, size = query.shape
    if key.shape[1] != heads:
        key, value = (_repeat_heads(t, heads) for t in (key, value))
    start = 0
    for length, count in runs:
        end = start + length * count
        if length:
            shape = (count, length, heads, size)
            q, k, v = (t[start:end].view(shape).transpose(1, 2) for t in (query, key, value))
            if window == FULL:
                attended = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            else:
                mask = _window_mask(length, causal, window, query.device)
                attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            output[start:end] = attended.transpose(1, 2).reshape(end - start, heads, size)
        start = end
    return output


def _window_mask(length: int, causal: bool, window: Window, device: torch.device) -> torch.Tensor:
    """[length, length]: whether the query of each row sees the key of each column, within
    `window` (left, right; -1 unbounded) and, if `causal`, not after itself.

    >>> _window_mask(4, False, (1, 1), torch.device("cpu")).int().tolist()
    [[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1], [0, 0, 1, 1]]
    """
    place = torch.arange(length, device=device)
    ahead = place.unsqueeze(0) - place.unsqueeze(1)
    left, right = window[0], 0 if causal else window[1]
    seen = torch.ones(length, length, dtype=torch.bool, device=device)
    if left >= 0:
        seen &= ahead >= -left
    if right >= 0:
        seen &= ahead <= right
    return seen


def _runs(lengths: np.ndarray) -> tuple[tuple[int, int], ...]:
    """(length, count) of each run of equal consecutive lengths.

    >>> _runs(np.array([5, 5, 3, 3, 3, 5]))
    ((5, 2), (3, 3), (5, 1))
    """
    if not len(lengths):
        return ()
    starts = np.flatnonzero(np.diff(lengths)) + 1
    bounds = np.concatenate([[0], starts, [len(lengths)]])
    pairs = zip(bounds[:-1], bounds[1:], strict=True)
    return tuple((int(lengths[a]), int(b - a)) for a, b in pairs)


@torch.library.custom_op("bulkembed::varlen_attention", mutates_args=())
def _varlen_operator(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens: torch.Tensor,
    run_table: torch.Tensor,
    longest: int,
    causal: bool,
    left: int,
    right: int,
) -> torch.Tensor:
    """The flash kernel where it runs (`kernel_runs`) and masks as asked, else the
    reference."""
    window = (left, right)
    if kernel_runs(str(query.device), query.dtype):
        attended = _kernel_call(query, key, value, cu_seqlens, longest, causal, window)
        if attended is not None:
            return attended
    return _reference(query, key, value, run_table.tolist(), causal, window)


@_varlen_operator.register_fake
def _(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens: torch.Tensor,
    run_table: torch.Tensor,
    longest: int,
    causal: bool,
    left: int,
    right: int,
) -> torch.Tensor:
    return torch.empty_like(query)


def varlen_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    sequences: Sequences,
    causal: bool = False,
    window: Window = FULL,
) -> torch.Tensor:
    """Attention within each document of a flat batch, through the custom operator: the
    flash kernel where it runs (`kernel_runs`), else the reference; `causal` for a decoder
    (each token attends to its document's tokens up to itself); `window` (left, right) for
    local attention (each token attends to the tokens at most that many places before and
    after it; -1: no bound). Keys and values may have fewer heads than queries."""
    cu, table, longest = sequences.cu_seqlens, sequences.run_table, sequences.longest
    return _varlen_operator(query, key, value, cu, table, longest, causal, *window)

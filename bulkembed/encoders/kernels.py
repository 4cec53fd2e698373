"""The CUDA kernels that compute variable-length attention, by name, and how each is called.

Each takes queries, keys and values [tokens, heads, head size] laid end to end, the
documents' starts (`cu_seqlens`) and the longest document, and scales by 1/sqrt(head size):

- `flash-attention-3`: flash-attention 3's `flash_attn_interface.flash_attn_varlen_func`,
  where its Hopper build is installed, on a GPU of compute capability 9.x;
- `varlen_attn`: PyTorch's `torch.nn.attention.varlen.varlen_attn` (2.10 and later, in a
  build with flash attention);
- `flash-attn-2`: flash-attn's `flash_attn_varlen_func`, where installed;
- `cudnn-jagged`: PyTorch's scaled-dot-product attention on jagged nested tensors, cuDNN's
  backend forced (no causal mask, no window).

All need CUDA, float16 or bfloat16 and compute capability 8.0 or later (`available`).
Which one a run takes is `kernel_choice`'s to decide; `preferred` is the first available in
that order, what a call names when it did not choose (`AUTO`). A kernel that cannot mask as
asked (a window, a causal mask) gives None, and the caller computes the reference.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# A local attention window: how many tokens before and after a token it attends to (-1: no
# bound), as the flash kernels take it.
Window = tuple[int, int]
FULL: Window = (-1, -1)

FLASH_ATTENTION_3 = "flash-attention-3"
VARLEN_ATTN = "varlen_attn"
FLASH_ATTN_2 = "flash-attn-2"
CUDNN_JAGGED = "cudnn-jagged"
# Not a kernel: PyTorch's scaled-dot-product attention per run of equal lengths
# (`varlen.reference_attention`), on any device and dtype.
REFERENCE = "reference"
# The kernel of `preferred`, in a call that did not choose one.
AUTO = "auto"
NAMES = (FLASH_ATTENTION_3, VARLEN_ATTN, FLASH_ATTN_2, CUDNN_JAGGED)

# Flash attention's kernels run on compute capability 8.0 (Ampere) and later;
# flash-attention 3's on 9.x (Hopper) only.
_FLASH_CAPABILITY = (8, 0)
_HOPPER_MAJOR = 9


@functools.cache
def _torch_varlen() -> Callable[..., Any] | None:
    """PyTorch's varlen flash kernel (2.10 and later)."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


@functools.cache
def _flash_attn_2() -> Callable[..., Any] | None:
    try:
        from flash_attn import flash_attn_varlen_func  # type: ignore[import-not-found]
    except ImportError:
        return None
    return flash_attn_varlen_func


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


def _jagged_available() -> bool:
    import torch
    from torch.nn.attention import SDPBackend

    cudnn = getattr(SDPBackend, "CUDNN_ATTENTION", None)
    return cudnn is not None and torch.backends.cudnn.is_available()


def available(device: str, dtype: torch.dtype) -> list[str]:
    """The kernels that can run on `device` in `dtype`, in the order of preference."""
    import torch

    if not device.startswith("cuda") or dtype not in (torch.float16, torch.bfloat16):
        return []
    capability = torch.cuda.get_device_capability(device)
    if capability < _FLASH_CAPABILITY:
        return []
    found = []
    if capability[0] == _HOPPER_MAJOR and _flash_attention_3() is not None:
        found.append(FLASH_ATTENTION_3)
    if _torch_varlen() is not None and torch.backends.cuda.is_flash_attention_available():
        found.append(VARLEN_ATTN)
    if _flash_attn_2() is not None:
        found.append(FLASH_ATTN_2)
    if _jagged_available():
        found.append(CUDNN_JAGGED)
    return found


def preferred(device: str, dtype: torch.dtype) -> str:
    """The first available kernel (`REFERENCE` where none is)."""
    return next(iter(available(device, dtype)), REFERENCE)


def describe(name: str) -> str:
    """`name` in words, with where it comes from."""
    return {
        FLASH_ATTENTION_3: "flash-attention 3 (flash_attn_interface)",
        VARLEN_ATTN: "PyTorch varlen_attn",
        FLASH_ATTN_2: "flash-attn 2 (flash_attn_varlen_func)",
        CUDNN_JAGGED: "cuDNN scaled-dot-product attention on jagged nested tensors",
        REFERENCE: "reference (scaled-dot-product attention per run of lengths)",
    }[name]


def call(
    name: str,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens: torch.Tensor,
    longest: int,
    causal: bool,
    window: Window,
) -> torch.Tensor | None:
    """Kernel `name`'s attention: `causal` masks each token from the tokens after it,
    `window` from those farther than (left, right) places; keys and values may have fewer
    heads than queries. None where the kernel cannot mask as asked."""
    if name == CUDNN_JAGGED:
        if causal or window != FULL:
            return None
        return _jagged(query, key, value, cu_seqlens, longest)
    kernel = {
        FLASH_ATTENTION_3: _flash_attention_3,
        VARLEN_ATTN: _torch_varlen,
        FLASH_ATTN_2: _flash_attn_2,
    }[name]()
    assert kernel is not None, f"{name} is not installed"
    masking = mask_arguments(kernel, causal, window)
    if masking is None:
        return None
    if key.shape[1] != query.shape[1]:
        if "enable_gqa" in _parameters(kernel):
            masking = {**masking, "enable_gqa": True}
        elif name == VARLEN_ATTN:
            key, value = (repeat_heads(t, query.shape[1]) for t in (key, value))
    attended = kernel(query, key, value, cu_seqlens, cu_seqlens, longest, longest, **masking)
    # flash-attention 3 returns (output, log-sum-exp) in some releases.
    output: torch.Tensor = attended[0] if isinstance(attended, tuple) else attended
    return output


def _jagged(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens: torch.Tensor,
    longest: int,
    backend: Any = None,
) -> torch.Tensor:
    """Scaled-dot-product attention over jagged nested tensors [documents, heads, length,
    head size] that view the flat tensors, on `backend` (cuDNN's unless told)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if key.shape[1] != query.shape[1]:
        key, value = (repeat_heads(t, query.shape[1]) for t in (key, value))
    offsets = cu_seqlens.long()
    # The lengths' bounds given, not computed from the offsets on the device (a wait for
    # the device at each call): the longest, and one token at least.
    q, k, v = (
        torch.nested.nested_tensor_from_jagged(
            t, offsets, max_seqlen=longest, min_seqlen=1
        ).transpose(1, 2)
        for t in (query, key, value)
    )
    with sdpa_kernel(backend or SDPBackend.CUDNN_ATTENTION):
        attended = F.scaled_dot_product_attention(q, k, v)
    output: torch.Tensor = attended.transpose(1, 2).values()
    return output


@functools.cache
def _parameters(kernel: Callable[..., Any]) -> frozenset[str]:
    return frozenset(inspect.signature(kernel).parameters)


def mask_arguments(
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


def repeat_heads(tensor: torch.Tensor, heads: int) -> torch.Tensor:
    """Keys or values [tokens, groups, size] with each group's head repeated for the
    `heads` query heads it serves."""
    return tensor.repeat_interleave(heads // tensor.shape[1], dim=1)

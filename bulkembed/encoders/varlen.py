"""Variable-length attention: the tokens of several documents laid end to end, each token
attending to the tokens of its own document only.

Queries, keys and values are [tokens, heads, head size]; `Sequences` says where each
document starts (`cu_seqlens`, as flash-attention names it: 0, then the running total of the
lengths) and which kernel attends (`kernels`, chosen by `kernel_choice`). Nothing is padded
and no [documents, length, length] mask exists.

Two implementations give the same result:
- a CUDA kernel over `cu_seqlens`, for float16 and bfloat16 on CUDA (`kernels`:
  flash-attention 3, PyTorch's `varlen_attn`, flash-attn 2, cuDNN on jagged nested
  tensors);
- `reference_attention`: PyTorch's scaled-dot-product attention on each run of documents of
  one length, stacked without padding (masked only for a local window). It runs on any
  device and dtype, and is what the tests check the flat path with on the CPU.

Both take a causal flag (decoders), a local window (ModernBERT's local layers, Mistral's
sliding window) and keys and values with fewer heads than queries (grouped-query attention).
A kernel that cannot mask as asked (PyTorch 2.9's has no window) leaves the call to the
reference.

`varlen_attention` calls them through one custom operator, `bulkembed::varlen_attention`,
which runs the kernel where it runs and the reference elsewhere: `torch.compile` sees one
opaque call of known output shape, so a compiled flat layer has no graph break, whichever
implementation runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from bulkembed.encoders import kernels
from bulkembed.encoders.kernels import AUTO, FULL, REFERENCE, Window, repeat_heads

__all__ = ["FULL", "Sequences", "Window", "reference_attention", "varlen_attention"]


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
      to specialize on);
    - `kernel`: the name of the kernel that attends (`kernels`; `AUTO`: the preferred one
      on the device, `REFERENCE`: none).

    >>> s = Sequences.on_host(np.array([3, 1, 1, 2]))
    >>> s.cu_seqlens.tolist(), s.token_documents.tolist(), s.longest, s.runs
    ([0, 3, 4, 5, 7], [0, 0, 0, 1, 2, 3, 3], 3, ((3, 1), (1, 2), (2, 1)))
    """

    cu_seqlens: torch.Tensor
    token_documents: torch.Tensor
    longest: int
    runs: tuple[tuple[int, int], ...]
    run_table: torch.Tensor
    kernel: str = AUTO

    @classmethod
    def on_host(cls, lengths: np.ndarray, kernel: str = AUTO) -> Sequences:
        """The sequences of documents of `lengths`, attended by `kernel`, as CPU
        tensors."""
        lengths = np.asarray(lengths, dtype=np.int64)
        cu_seqlens = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        documents = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
        longest = int(lengths.max()) if len(lengths) else 0
        runs = _runs(lengths)
        table = torch.tensor(runs, dtype=torch.int64).reshape(len(runs), 2)
        cu, tokens = torch.from_numpy(cu_seqlens), torch.from_numpy(documents)
        return cls(cu, tokens, longest, runs, table, kernel)

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
        return Sequences(*moved, self.longest, self.runs, self.run_table, self.kernel)


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
        key, value = (repeat_heads(t, heads) for t in (key, value))
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
    kernel: str,
) -> torch.Tensor:
    """Kernel `kernel` (`AUTO`: the device's preferred) where it masks as asked, else the
    reference."""
    window = (left, right)
    if kernel == AUTO:
        kernel = kernels.preferred(str(query.device), query.dtype)
    if kernel != REFERENCE:
        attended = kernels.call(kernel, query, key, value, cu_seqlens, longest, causal, window)
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
    kernel: str,
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
    kernel `sequences` names where it runs, else the reference; `causal` for a decoder
    (each token attends to its document's tokens up to itself); `window` (left, right) for
    local attention (each token attends to the tokens at most that many places before and
    after it; -1: no bound). Keys and values may have fewer heads than queries."""
    cu, table, longest = sequences.cu_seqlens, sequences.run_table, sequences.longest
    kernel = sequences.kernel
    return _varlen_operator(query, key, value, cu, table, longest, causal, *window, kernel)

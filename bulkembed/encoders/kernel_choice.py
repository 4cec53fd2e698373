"""Which attention kernel a flat model runs on its GPU: the fastest of those available
(`kernels.available`) that agrees with the reference on the model's own attention shape.

The check (`measure`) gives every kernel the same random queries, keys and values at the
model's heads, key heads and head size, once for each mask its layers ask for (causal, a
local window), on documents of mixed lengths up to the model's maximum. A kernel passes when
it can mask every way asked and its output is within `CHECK_ERROR` of the float32
reference (‖out − ref‖ / ‖ref‖). Its time is that of a second set of documents of other
lengths, after a first set warmed it up: a kernel that prepares a plan for each new shape
pays for it there, as it would on every batch of a run. The fastest that passes is chosen;
where none passes, the reference (correct and slow).

The choice is recorded (`decisions`, `attention-kernels/`) under the device, the dtype, the
libraries' versions, the shape and the kernels available, and taken by later runs without
measuring again. `BULKEMBED_ATTENTION_KERNEL` names a kernel to take without the check
(`reference` takes none); `auto`, the default, chooses.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from bulkembed.encoders import kernels
from bulkembed.encoders.decisions import device_key, read_decision, record_decision
from bulkembed.encoders.kernels import AUTO, FULL, REFERENCE, Window
from bulkembed.errors import UsageError

if TYPE_CHECKING:
    import torch

    from bulkembed.encoders.varlen import Sequences

    # Queries, keys and values.
    QKV = tuple[torch.Tensor, torch.Tensor, torch.Tensor]

KERNEL_VARIABLE = "BULKEMBED_ATTENTION_KERNEL"
# What chose between flash-attention 3 and 2 before: a run that sets it is told it is not read.
FORMER_KERNEL_VARIABLE = "BULKEMBED_FLASH_ATTENTION"
# The largest relative error of a kernel's output against the float32 reference; half
# precision kernels land near 0.003 (see docs/benchmarks.md).
CHECK_ERROR = 0.02
# Tokens of each set of documents the check runs, and their longest document.
CHECK_TOKENS = 16384
_CHECK_LONGEST = 2048
_SHORTEST = 8
_KIND = "attention-kernels"
# Bumped when a recorded choice means something else.
_RECORD_FORMAT = 1


@dataclass(frozen=True, slots=True)
class AttentionShape:
    """What a model's attention computes: query heads, key and value heads, head size, the
    masks its layers ask for (causal, window) and its longest document."""

    heads: int
    key_heads: int
    size: int
    masks: tuple[tuple[bool, Window], ...]
    longest: int

    @classmethod
    def of(cls, module: Any, longest: int) -> AttentionShape:
        """The shape of a flat module (`flat.flat_module`): its config's heads and key
        heads, and the `causal` flags, `window`s and `head_size` its submodules say (a
        window: none; a head size: the config's `head_dim`, else hidden size / heads)."""
        config = module.config
        heads = int(config.num_attention_heads)
        key_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        parts = [m for m in module.modules() if isinstance(getattr(m, "causal", None), bool)]
        masks = {(bool(m.causal), _window(getattr(m, "window", FULL))) for m in parts}
        sizes = [int(m.head_size) for m in module.modules() if hasattr(m, "head_size")]
        size = getattr(config, "head_dim", None) or config.hidden_size // heads
        ordered = tuple(sorted(masks or {(False, FULL)}))
        return cls(heads, key_heads, sizes[0] if sizes else int(size), ordered, longest)


def _window(window: Any) -> Window:
    return (int(window[0]), int(window[1]))


@dataclass(frozen=True, slots=True)
class KernelChoice:
    """The kernel a model runs, and how it was chosen: `measured` now (with each
    kernel's `seconds`, None for one that failed the check), `recorded` by an earlier run,
    `asked` by `BULKEMBED_ATTENTION_KERNEL`, or `only` (the reference: no kernel here)."""

    name: str
    how: str
    seconds: dict[str, float | None]

    def describe(self) -> str:
        timed = ", ".join(
            f"{name} {'failed the check' if spent is None else f'{spent * 1e3:.2f} ms'}"
            for name, spent in self.seconds.items()
        )
        return f"attention kernel {self.name} ({self.how}{': ' + timed if timed else ''})"


def choose_kernel(device: str, dtype: torch.dtype, shape: AttentionShape) -> KernelChoice:
    """The kernel that attends for a model of `shape` on `device` in `dtype` (see the
    module's docstring); a one-line error for a `BULKEMBED_ATTENTION_KERNEL` that does not
    run here. Where no kernel runs (a CPU, float32), the reference, whatever it asks."""
    names = kernels.available(device, dtype)
    if not names:
        return KernelChoice(REFERENCE, "only", {})
    asked = os.environ.get(KERNEL_VARIABLE, AUTO).strip().lower()
    if asked != AUTO:
        if asked not in (*names, REFERENCE):
            offered = ", ".join((AUTO, *names, REFERENCE))
            raise UsageError(
                f"{KERNEL_VARIABLE}={asked}: no such kernel runs on {device} in "
                f"{str(dtype).removeprefix('torch.')}; use one of {offered}"
            )
        return KernelChoice(asked, "asked", {})
    key = {"format": _RECORD_FORMAT, **device_key(device, dtype), "shape": asdict(shape)}
    key |= {"kernels": names, "libraries": _kernel_libraries()}
    found = read_decision(_KIND, key)
    recorded = found.get("seconds") if found is not None else None
    if found is not None and found.get("kernel") in (*names, REFERENCE):
        seconds = recorded if isinstance(recorded, dict) else {}
        return KernelChoice(found["kernel"], "recorded", seconds)
    seconds = measure(names, device, dtype, shape)
    passed = {name: spent for name, spent in seconds.items() if spent is not None}
    name = min(passed, key=lambda n: passed[n]) if passed else REFERENCE
    record_decision(_KIND, key, {"kernel": name, "seconds": seconds})
    return KernelChoice(name, "measured", seconds)


def _kernel_libraries() -> dict[str, Any]:
    """The versions of the libraries the kernels come from (PyTorch's is in every key)."""
    import torch

    from bulkembed.models.export_cache import installed_version

    names = ("flash_attn", "flash_attn_3")
    found: dict[str, Any] = {name: installed_version(name) for name in names}
    return found | {"cudnn": torch.backends.cudnn.version()}


def check_lengths(longest: int, seed: int) -> np.ndarray:
    """Document lengths of one set of the check: log-uniform from `_SHORTEST` to
    `longest` (at most `_CHECK_LONGEST`), `CHECK_TOKENS` in all, longest first as a window
    sorts them.

    >>> lengths = check_lengths(512, 0)
    >>> int(lengths.sum()) <= 16384, int(lengths.max()) <= 512, int(lengths.min()) >= 8
    (True, True, True)
    """
    top = max(_SHORTEST, min(longest, _CHECK_LONGEST))
    random = np.random.default_rng(seed)
    drawn = np.exp(random.uniform(np.log(_SHORTEST), np.log(top), CHECK_TOKENS // _SHORTEST))
    lengths = drawn.astype(np.int64)
    lengths = lengths[np.cumsum(lengths) <= CHECK_TOKENS]
    return np.sort(lengths)[::-1].copy()


def measure(
    names: list[str], device: str, dtype: torch.dtype, shape: AttentionShape
) -> dict[str, float | None]:
    """Each kernel's seconds on the check's second set of documents, every mask of
    `shape` (None: it failed the check)."""
    import torch

    from bulkembed.encoders.varlen import Sequences, reference_attention

    torch.manual_seed(0)
    sets = []
    for seed in (0, 1):
        sequences = Sequences.on_host(check_lengths(shape.longest, seed))
        sequences = sequences.to(lambda t: t.to(device))
        tokens = int(sequences.cu_seqlens[-1])
        # Views of one fused projection, strided as a flat layer's queries, keys and
        # values are.
        heads = (shape.heads, shape.key_heads, shape.key_heads)
        fused = torch.randn(tokens, sum(heads) * shape.size, device=device, dtype=dtype)
        parts = fused.split([h * shape.size for h in heads], dim=-1)
        query, key, value = (part.view(tokens, -1, shape.size) for part in parts)
        sets.append((sequences, (query, key, value)))
    checked, (query, key, value) = sets[0]
    upcast = (query.float(), key.float(), value.float())
    wanted = {mask: reference_attention(*upcast, checked, *mask) for mask in shape.masks}
    found: dict[str, float | None] = {}
    with _quiet():
        for name in names:
            found[name] = _timed(name, sets, wanted, device)
    return found


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Keep the warnings and log lines of kernels that decline these inputs (PyTorch logs
    why each scaled-dot-product backend did) out of the run's output."""
    logger = logging.getLogger("torch.nested._internal.sdpa")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def _timed(
    name: str,
    sets: list[tuple[Sequences, QKV]],
    wanted: dict[tuple[bool, Window], torch.Tensor],
    device: str,
) -> float | None:
    """Kernel `name`'s seconds on the second set, after checking it on the first."""

    def attend(sequences: Sequences, qkv: QKV, mask: tuple[bool, Window]) -> torch.Tensor | None:
        cu, longest = sequences.cu_seqlens, sequences.longest
        return kernels.call(name, *qkv, cu, longest, *mask)

    try:
        for mask, reference in wanted.items():
            out = attend(*sets[0], mask)
            if out is None or _error(out, reference) > CHECK_ERROR:
                return None
        _synchronize(device)
        started = time.perf_counter()
        for mask in wanted:
            attend(*sets[1], mask)
        _synchronize(device)
    except Exception:  # a kernel that fails on these inputs is not taken
        return None
    return time.perf_counter() - started


def _error(out: torch.Tensor, reference: torch.Tensor) -> float:
    import torch

    difference = torch.linalg.vector_norm(out.float() - reference)
    return float(difference / torch.linalg.vector_norm(reference).clamp_min(1e-30))


def _synchronize(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize(device)

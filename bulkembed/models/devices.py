"""Pick the device and compute dtype from `--devices` and `--dtype`."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import platform
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from bulkembed.config import DType
from bulkembed.errors import UsageError
from bulkembed.wording import counted

if TYPE_CHECKING:
    import torch


def resolve_device(devices: str) -> str:
    """`cpu`, `cuda` or `cuda:N` as a torch device string that exists here."""
    import torch

    choice = devices.strip().lower()
    if choice == "cpu":
        return "cpu"
    if choice == "cuda" or choice.startswith("cuda:"):
        index_text = choice.partition(":")[2] or "0"
        if not index_text.isdigit():
            raise UsageError(f"--devices {devices}: expected cuda:N with N a number")
        available = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if int(index_text) >= available:
            raise UsageError(
                f"--devices {devices}: this machine has {counted(available, 'CUDA device')}; "
                "use --devices cpu or auto"
            )
        return f"cuda:{index_text}"
    raise UsageError(f"--devices {devices}: expected auto, cpu or cuda:N")


def resolve_devices(devices: str) -> list[str]:
    """`--devices`: `auto` (every CUDA device, else the CPU) or a comma-separated list of
    `cpu`, `cuda` and `cuda:N`; one encoder worker per entry (`cpu,cpu`: two on the CPU)."""
    if devices.strip().lower() == "auto":
        if not _gpu_driver():
            return ["cpu"]
        import torch

        if torch.cuda.is_available():
            return [f"cuda:{i}" for i in range(torch.cuda.device_count())]
        return ["cpu"]
    chosen = [resolve_device(d) for d in devices.split(",") if d.strip()]
    if not chosen:
        raise UsageError(f"--devices {devices!r}: name at least one device")
    return chosen


# Where a GPU driver shows itself on Linux (NVIDIA, AMD ROCm, WSL): without any of them no
# CUDA device can be found, and `--devices auto` is the CPU without importing torch.
_GPU_DRIVER_PATHS = (
    "/proc/driver/nvidia",
    "/dev/nvidiactl",
    "/dev/nvidia0",
    "/dev/kfd",
    "/dev/dxg",
)


def _gpu_driver() -> bool:
    """Whether a GPU driver may be present (always, but on Linux)."""
    return sys.platform != "linux" or any(os.path.exists(p) for p in _GPU_DRIVER_PATHS)


def cpu_threads_per_worker(devices: list[str]) -> int:
    """Torch threads for each CPU worker: the cores shared out among them."""
    workers = max(1, sum(1 for d in devices if d == "cpu"))
    return max(1, (os.cpu_count() or 1) // workers)


_BFLOAT16_UNITS = re.compile(r"\b(amx_bf16|avx512_bf16)\b")
_INT8_UNITS = re.compile(r"\b(avx512_vnni|avx_vnni|amx_int8)\b")


def cpu_accelerates_bfloat16() -> bool:
    """Whether this CPU multiplies bfloat16 matrices in hardware (AMX or AVX512-BF16).
    Without them torch emulates bfloat16, several times slower than float32."""
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return _BFLOAT16_UNITS.search(flags) is not None


def cpu_multiplies_int8() -> bool:
    """Whether this CPU multiplies int8 matrices in hardware (VNNI, AVX-VNNI or AMX)."""
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return _INT8_UNITS.search(flags) is not None


def device_identity(device: str) -> str:
    """What a device's arithmetic depends on: a CPU's model name and flags, a GPU's name
    and compute capability."""
    if device == "cpu":
        try:
            info = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return f"cpu {platform.machine()} {platform.processor()}"
        fields = dict(
            line.split(":", 1) for line in info.split("\n\n", 1)[0].splitlines() if ":" in line
        )
        names = ("model name", "flags", "Features", "CPU implementer", "CPU part")
        return " | ".join(fields[n].strip() for n in names if n in fields)
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    return f"{torch.cuda.get_device_name(device)} sm_{major}{minor}"


def cuda_supports_bfloat16(device: str) -> bool:
    """Whether a CUDA device computes in bfloat16 natively (compute capability 8.0 on)."""
    import torch

    return torch.cuda.get_device_capability(device) >= (8, 0)


def dtype_choice(dtype: DType, device: str) -> str:
    """`--dtype` as the name of a torch dtype, with `auto` as bfloat16 on CUDA where the
    device computes in it (compute capability 8.0 on: float32's range, so no overflow
    whatever the model was saved in), else float16; on a CPU bfloat16 where the CPU
    accelerates it, else float32. A half-precision `auto` choice is checked against
    float32 at start-up (see `bulkembed.engine.precision`), and a batch that gives values that are
    not finite in it is embedded again in float32. The int8 dtypes compute around their
    int8 matrix multiplies in float32 (`bulkembed.encoders.int8`). Imports no torch for a
    CPU."""
    if dtype in (DType.INT8, DType.INT8_WEIGHTS):
        return "float32"
    if dtype is not DType.AUTO:
        return dtype.value
    if device != "cpu":
        return "bfloat16" if cuda_supports_bfloat16(device) else "float16"
    return "bfloat16" if cpu_accelerates_bfloat16() else "float32"


def resolve_dtype(dtype: DType, device: str) -> torch.dtype:
    """`dtype_choice`, as a torch dtype."""
    import torch

    dtype_of: torch.dtype = getattr(torch, dtype_choice(dtype, device))
    return dtype_of


@contextlib.contextmanager
def exact_float32() -> Iterator[None]:
    """float32 matrix multiplies in full float32 (no TF32) for the `with` block: for the
    reference that a half-precision dtype is checked against."""
    import torch

    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def allow_tensor_cores(device: str, dtype: torch.dtype) -> None:
    """float32 matrix multiplies on CUDA in TF32 (10-bit mantissa, float32 range): several
    times faster on tensor cores, at about 1e-3 relative error per product, well inside
    what the start-up check and the parity tests accept for half precision."""
    import torch

    if device.startswith("cuda") and dtype == torch.float32:
        torch.set_float32_matmul_precision("high")


_M_MMAP_THRESHOLD = -3  # glibc mallopt parameter
_MMAP_THRESHOLD_BYTES = 256 * 2**20


def keep_memory_flat() -> None:
    """Keep resident memory flat across batches on Linux CPUs. Call before the model runs.

    Two things made memory creep up with the number of batches on the benchmark corpus:

    - oneDNN caches a compiled primitive, with its buffers, for every input shape it meets,
      up to 1024 of them; token-budget batches come in many shapes, so the cache only grows.
      It is turned off (`ONEDNN_PRIMITIVE_CACHE_CAPACITY=0`, unless set already): building a
      primitive takes microseconds next to a batch of thousands of tokens;
    - glibc raises its mmap threshold each time a large buffer is freed, and trims its heap
      by rules that move with it. Fixing the threshold turns both adaptations off. It is
      fixed high (256 MB): activation buffers come from the heap and are reused from batch
      to batch; a low threshold (128 KB) mapped and unmapped every one of them, and the page
      faults cost 40% of bfloat16 throughput (8,600 against 14,500 tokens/s for
      all-MiniLM-L6-v2 on two cores), with no gain in memory (10× the corpus: 1.03× the
      peak resident memory at 256 MB).
    """
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "0")
    if not sys.platform.startswith("linux"):
        return
    name = ctypes.util.find_library("c")
    if name is None:
        return
    try:
        ctypes.CDLL(name).mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES)
    except (OSError, AttributeError):
        return

"""What a benchmark ran on: the CPU by name, the vector and matrix units that decide its
kernels, the cores torch uses, and the versions of the libraries that ran the model."""

from __future__ import annotations

import importlib.metadata
import os
import re
from pathlib import Path
from typing import Any

# The CPU flags that choose kernels: AVX-512, its bfloat16 and int8 dot products, AMX.
FLAGS = ("avx512f", "avx512_bf16", "avx512_vnni", "avx512_fp16", "amx_tile", "amx_bf16")
LIBRARIES = ("torch", "transformers", "openvino", "onnxruntime", "sentence-transformers")


def describe() -> dict[str, Any]:
    """The machine and library versions, as a JSON-ready dict."""
    import torch

    try:
        cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        cpuinfo = ""
    name = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.MULTILINE)
    flags = set(re.findall(r"\S+", (re.search(r"^flags\s*:(.*)$", cpuinfo, re.M) or [""])[0]))
    versions = {}
    for library in LIBRARIES:
        try:
            versions[library] = importlib.metadata.version(library)
        except importlib.metadata.PackageNotFoundError:
            continue
    return {
        "cpu": name.group(1).strip() if name else "unknown",
        "cpu_flags": [f for f in FLAGS if f in flags],
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "versions": versions,
    }

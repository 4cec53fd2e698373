"""What runs a transformer: PyTorch or OpenVINO (`choose_backend`), flat or padded batches
(`choose_attention`), and the model itself, loaded from its files without running code
from them (`load_model`, `load_state`)."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bulkembed.config import Attention, Backend
from bulkembed.errors import ModelError, UsageError

if TYPE_CHECKING:
    import torch

    from bulkembed.models.model_spec import ModelSpec

_NOT_TENSORS = (
    "its pickle holds more than tensors, and bulkembed runs no code from model files "
    "(torch.load with weights_only=True refused it); use safetensors weights"
)
# transformers places weights with `device_map` without accelerate from this major version.
_DEVICE_MAP_ALONE = 5
# Weights a checkpoint may lack without harm: the pooler, which no encoder uses.
_UNUSED_WEIGHTS = ("pooler.",)


def load_state(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a PyTorch weights file, unpickled with `weights_only`: a pickle that
    holds anything else (code to run) is refused."""
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise ModelError(f"{path} is not a plain file of tensors: {_NOT_TENSORS}") from e


def attention_implementation(device: str, dtype: torch.dtype) -> str:
    """flash-attention 2 on CUDA in half precision when the `flash_attn` package is
    installed (it skips the padding), else PyTorch's fused scaled-dot-product attention."""
    import importlib.util

    import torch

    half = dtype in (torch.float16, torch.bfloat16)
    if device.startswith("cuda") and half and importlib.util.find_spec("flash_attn"):
        return "flash_attention_2"
    return "sdpa"


def placement(device: str) -> dict[str, Any]:
    """How `from_pretrained` puts the weights on `device`: straight from the files onto a
    GPU (`device_map`), never all in host memory first, where transformers can (5.0 on, or
    with accelerate installed); elsewhere in host memory, moved after."""
    import importlib.util

    import transformers

    if not device.startswith("cuda"):
        return {}
    major = int(transformers.__version__.split(".")[0])
    if major >= _DEVICE_MAP_ALONE or importlib.util.find_spec("accelerate") is not None:
        return {"device_map": device}
    return {}


def load_model(spec: ModelSpec, device: str, dtype: torch.dtype, masked_lm: bool = False) -> Any:
    """The transformer of `spec` on `device` in eval mode, quietly; an error if weights it
    needs are missing from the checkpoint (they would otherwise be random)."""
    from transformers import AutoModel, AutoModelForMaskedLM
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    transformers_logging.set_verbosity_error()
    kind = AutoModelForMaskedLM if masked_lm else AutoModel
    options = {"revision": spec.revision, "dtype": dtype, "output_loading_info": True}
    options |= placement(device)
    attention = attention_implementation(device, dtype)
    try:
        try:
            model, info = kind.from_pretrained(
                spec.source, attn_implementation=attention, **options
            )
        except ValueError:
            # An architecture without that attention: take its own default.
            model, info = kind.from_pretrained(spec.source, **options)
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot load the model {spec.source}: {e}") from e
    except pickle.UnpicklingError as e:
        raise ModelError(f"cannot load the model {spec.source}: {_NOT_TENSORS}") from e
    missing = [k for k in info.get("missing_keys", ()) if not k.startswith(_UNUSED_WEIGHTS)]
    if missing:
        shown = ", ".join(sorted(missing)[:3])
        what = "a masked-LM head" if masked_lm else "these weights"
        raise ModelError(
            f"{spec.source} lacks {what} ({len(missing)} missing, e.g. {shown}): "
            "is it the right kind of model for these outputs?"
        )
    return model.eval().to(device)


def choose_backend(spec: ModelSpec, device: str, dtype: torch.dtype) -> Backend:
    """What runs the transformer of `spec` on `device` in `dtype`: `--backend`, with `auto`
    as OpenVINO on a CPU for an architecture whose conversion is tested, in float32 or
    bfloat16, without `--compile`, when the `openvino` package is installed; else PyTorch.
    `--attention flat` runs in PyTorch. An explicit `--backend openvino` that cannot run is
    a one-line usage error."""
    from bulkembed.encoders.openvino import converts, openvino_installed

    backend = Backend(spec.backend)
    if backend is Backend.TORCH:
        return backend
    if backend is Backend.AUTO:
        flat = Attention(spec.attention) is Attention.FLAT
        usable = device == "cpu" and not (spec.compile or flat) and converts(spec.model_type, dtype)
        return Backend.OPENVINO if usable and openvino_installed() else Backend.TORCH
    if device != "cpu":
        raise UsageError(f"--backend openvino runs on the CPU, not {device}: pass --devices cpu")
    if str(dtype) not in ("torch.float32", "torch.bfloat16"):
        raise UsageError(
            "--backend openvino computes in float32 or bfloat16: pick one with --dtype"
        )
    if not openvino_installed():
        raise UsageError("--backend openvino needs the openvino package: pip install openvino")
    return backend


def choose_attention(
    spec: ModelSpec, device: str, dtype: torch.dtype
) -> tuple[Attention, str | None]:
    """The batch layout asked for, flat or padded (the model may still be unable to run
    flat), and a remark for the log when `auto` cannot take flat on CUDA: `--attention`, with
    `auto` flat where a variable-length flash kernel runs attention (CUDA in half
    precision), else padded (on a CPU the padded OpenVINO graph runs faster than the flat
    PyTorch path; see docs/design.md)."""
    from bulkembed.encoders import kernels

    attention = Attention(spec.attention)
    if attention is not Attention.AUTO:
        return attention, None
    # A flash kernel: cuDNN's on jagged tensors takes no causal mask and no window.
    if set(kernels.available(device, dtype)) - {kernels.CUDNN_JAGGED}:
        return Attention.FLAT, None
    if device.startswith("cuda") and str(dtype) != "torch.float32":
        return Attention.PADDED, (
            f"no variable-length attention kernel runs here (it needs a GPU of compute "
            f"capability 8.0 or later and PyTorch 2.10 with flash attention, or flash-attn): "
            f"batches run padded on {device}"
        )
    return Attention.PADDED, None

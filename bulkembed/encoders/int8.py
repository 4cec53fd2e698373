"""int8 on the CPU: the OpenVINO graph of a text model quantized by NNCF, in one of two
modes (`--dtype`):

- `int8-weights`: the linear layers' weights stored in int8 (asymmetric, per output
  channel: `nncf.compress_weights`), nothing calibrated, the same graph for every corpus.
  The CPU plugin quantizes each matrix multiply's activations on the fly, in groups of
  `DYNAMIC_GROUP_SIZE` values, and multiplies in int8 (VNNI, AMX): without that it
  would dequantize the weights and multiply in float32, no faster than float32.
- `int8`: weights and activations in int8 with fixed scales (`nncf.quantize`), calibrated
  on about `CALIBRATION_DOCUMENTS` documents of the run, with the transformer model type
  (attention's matrix multiplies and layer norms' inputs are left in float, SmoothQuant
  moves the activations' outliers into the weights). Quantized without it, the same model
  gave vectors at cosine 0.58 to float32's.

Either is written in the export cache beside the float32 conversion, under a key that holds
the conversion's, the mode, every setting below, NNCF's version and the calibration's
digest, and is checked against float32 on the run's first documents before the run uses it
(`bulkembed.engine.int8_check`).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bulkembed.config import Backend, DType
from bulkembed.encoders.openvino_import import import_openvino
from bulkembed.errors import ModelError, UsageError
from bulkembed.models.export_cache import converted, installed_version

if TYPE_CHECKING:
    from bulkembed.models.model_spec import ModelSpec

INT8_DTYPES = (DType.INT8.value, DType.INT8_WEIGHTS.value)
# The architectures whose int8 graphs are measured (docs/int8.md): text encoders only.
QUANTIZED_MODEL_TYPES = frozenset({"bert", "roberta", "xlm-roberta"})
CALIBRATION_DOCUMENTS = 300
# Values per group the CPU plugin quantizes an int8-weights layer's activations in, set here
# rather than left to the plugin's default, so that the vectors do not change with it.
DYNAMIC_GROUP_SIZE = 32
# Set to 0, `--dtype auto` never tries int8 (float32 where the CPU has no bfloat16 units).
AUTO_VARIABLE = "BULKEMBED_AUTO_INT8"
# Bumped when what a quantization writes changes, so that older folders are not used.
QUANTIZATION_FORMAT = 1


def nncf_installed() -> bool:
    """Whether the `nncf` package can be imported."""
    return importlib.util.find_spec("nncf") is not None


def why_no_int8(spec: ModelSpec, device: str) -> str | None:
    """Why `spec` cannot run in int8 on `device` (None: it can)."""
    if device != "cpu":
        return f"int8 runs on the CPU, not {device}"
    if spec.model_type not in QUANTIZED_MODEL_TYPES:
        return f"int8 is measured for BERT, RoBERTa and XLM-RoBERTa models, not {spec.model_type}"
    if spec.outputs != ("dense",):
        return "int8 is checked for dense vectors only, and this run writes sparse or multi-vectors"
    if spec.backend == Backend.TORCH.value or spec.compile or spec.attention == "flat":
        return "int8 runs on the OpenVINO backend (--backend auto or openvino, padded batches)"
    if importlib.util.find_spec("openvino") is None or not nncf_installed():
        return "int8 needs the openvino and nncf packages: pip install openvino nncf"
    return None


def int8_mode(dtype: DType, devices: list[str], spec: ModelSpec, one_process: bool) -> str | None:
    """The int8 dtype a run tries (`int8-weights`, `int8`), or None: `--dtype int8` and
    `int8-weights` as asked (a one-line error where they cannot run), and `--dtype auto` as
    `int8-weights` on a CPU that multiplies int8 in hardware and bfloat16 not, where the
    model can run it and `AUTO_VARIABLE` is not `0`."""
    from bulkembed.models.devices import cpu_accelerates_bfloat16, cpu_multiplies_int8

    if dtype.value in INT8_DTYPES:
        why = (
            why_no_int8(spec, devices[0])
            if one_process and len(devices) == 1
            else "int8 is checked in one process on one device, not on a Ray cluster or "
            "several devices"
        )
        if why is not None:
            raise UsageError(f"--dtype {dtype.value}: {why}; pick --dtype float32 or auto")
        return dtype.value
    if dtype is not DType.AUTO or not one_process or os.environ.get(AUTO_VARIABLE) == "0":
        return None
    if len(devices) > 1 or why_no_int8(spec, devices[0]) is not None:
        return None
    if cpu_accelerates_bfloat16():
        return None
    return DType.INT8_WEIGHTS.value if cpu_multiplies_int8() else None


@dataclass(frozen=True, slots=True)
class Calibration:
    """The documents, as token ids, that static int8 takes its activations' ranges from."""

    sequences: tuple[np.ndarray, ...]

    @property
    def digest(self) -> str:
        """The digest of the documents' token ids, in order."""
        digest = hashlib.blake2b(digest_size=16)
        for sequence in self.sequences:
            ids = np.asarray(sequence, dtype=np.int64)
            digest.update(len(ids).to_bytes(8, "little"))
            digest.update(ids.tobytes())
        return digest.hexdigest()

    def inputs(self) -> list[dict[str, np.ndarray]]:
        """One model input per document (no padding: each is its own batch)."""
        found = []
        for sequence in self.sequences:
            ids = np.asarray(sequence, dtype=np.int64).reshape(1, -1)
            found.append({"input_ids": ids, "attention_mask": np.ones_like(ids)})
        return found


def quantization_key(
    conversion: dict[str, Any], mode: str, calibration: Calibration | None
) -> dict[str, Any]:
    """What a quantized graph depends on (see the module's docstring)."""
    settings: dict[str, Any] = {"weights": "int8-asym"}
    if mode == DType.INT8.value:
        settings = {"model_type": "transformer", "subset": CALIBRATION_DOCUMENTS}
    return {
        **conversion,
        "quantization": QUANTIZATION_FORMAT,
        "mode": mode,
        "settings": settings,
        "nncf": installed_version("nncf"),
        "calibration": None if calibration is None else calibration.digest,
    }


def quantize(graph: Any, mode: str, calibration: Calibration | None, folder: Path) -> None:
    """Write `graph` quantized in `mode` as `folder/model.xml` and `model.bin`."""
    import nncf

    ov = import_openvino()
    nncf.set_log_level(logging.ERROR)
    # NNCF draws progress bars on standard output: the run's progress says what happens.
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        if mode == DType.INT8_WEIGHTS.value:
            weights = nncf.CompressWeightsMode.INT8_ASYM
            quantized = nncf.compress_weights(graph.clone(), mode=weights)
        else:
            assert calibration is not None, "static int8 is calibrated"
            quantized = nncf.quantize(
                graph.clone(),
                nncf.Dataset(calibration.inputs()),
                model_type=nncf.ModelType.TRANSFORMER,
                subset_size=len(calibration.sequences),
            )
    ov.save_model(quantized, folder / "model.xml", compress_to_fp16=False)


def quantized_graph(
    source: str,
    conversion: dict[str, Any],
    graph: Any,
    mode: str,
    calibration: Calibration | None,
    tell: Callable[[str], None],
) -> Any:
    """`graph` (converted under the key `conversion`) quantized in `mode`, from the export
    cache, which it is written in first unless a valid one is there."""
    ov = import_openvino()

    def build(folder: Path) -> None:
        quantize(graph, mode, calibration, folder)

    def rebuilt(reason: str) -> None:
        tell(f"the cached {mode} model of {source} is unusable ({reason}): quantizing it again")

    def unwritable(reason: str) -> None:
        tell(f"the export cache {reason}: quantizing {source} in a temporary folder")

    key = quantization_key(conversion, mode, calibration)
    try:
        with converted("openvino-int8", key, build, rebuilt, unwritable) as folder:
            return ov.Core().read_model(folder / "model.xml")
    except Exception as e:
        # NNCF raises errors of its own types, OpenVINO and the import others: any of them
        # leaves the run in float32 (or, replaying an int8 decision, stops it).
        raise ModelError(f"NNCF cannot quantize {source} to {mode}: {e}".splitlines()[0]) from e


def int8_settings(mode: str) -> dict[str, Any]:
    """The CPU plugin's settings for a graph quantized in `mode`: float32 around the int8
    matrix multiplies, and the activations' dynamic quantization set either way."""
    group = DYNAMIC_GROUP_SIZE if mode == DType.INT8_WEIGHTS.value else 0
    return {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": group}

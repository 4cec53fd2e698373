"""The shape of the written vectors: Matryoshka truncation, float16, quantization.

Applied to a window's embeddings after the model and before the sink, so every encoder
gets them alike. Dense vectors are truncated to `--dim` first and then L2-normalized again
(when the model normalizes), as Matryoshka models are meant to be used.

Quantization of dense vectors:

- int8 / uint8: each dimension's [min, max] over a calibration sample is cut into 256 steps:
  q = clip(floor((x - min) / step), 0, 255), minus 128 for int8. The ranges are computed once
  per run, from the first window of documents, and stored in `_bulkembed/quantization.json`,
  so every part of the run (and every resumed run) shares one scale;
- binary / ubinary: one bit per dimension (x > 0), packed 8 to a byte; binary subtracts 128
  from each byte to make it int8.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from bulkembed.contracts import Embeddings
from bulkembed.errors import BulkembedError, UsageError

if TYPE_CHECKING:
    from bulkembed.config import ModelSettings
    from bulkembed.models.model_spec import ModelSpec

# int8/uint8 ranges from fewer documents than this would be a guess.
MIN_CALIBRATION_DOCUMENTS = 2


@dataclass(frozen=True)
class OutputFormat:
    """How dense and multi-vector outputs are written."""

    dim: int | None = None
    normalize: bool = False
    layer_norm_before_dim: bool = False
    dtype_out: str = "float32"
    quantize: str | None = None
    ranges: np.ndarray | None = None

    @classmethod
    def for_run(cls, model: ModelSettings, spec: ModelSpec) -> OutputFormat:
        """`--dim`, `--dtype-out` and `--quantize`, checked against the model's outputs."""
        dense_dim = spec.dense_dim
        if (model.dim is not None or model.quantize is not None) and dense_dim is None:
            raise UsageError(
                "--dim and --quantize apply to dense vectors: this run writes "
                f"{', '.join(spec.outputs)}"
            )
        if model.dtype_out.value != "float32" and not {"dense", "multivector"} & set(spec.outputs):
            raise UsageError("--dtype-out applies to dense and multi-vector outputs")
        if model.dim is not None:
            assert dense_dim is not None
            if spec.dims and model.dim not in spec.dims:
                sizes = ", ".join(map(str, spec.dims))
                raise UsageError(f"--dim {model.dim}: this model's vectors can be cut to {sizes}")
            if model.dim > dense_dim:
                raise UsageError(f"--dim {model.dim}: this model's vectors have {dense_dim}")
        return cls(
            dim=model.dim,
            normalize=spec.normalize,
            layer_norm_before_dim=spec.matryoshka_layer_norm,
            dtype_out=model.dtype_out.value,
            quantize=None if model.quantize is None else model.quantize.value,
        )

    @property
    def needs_ranges(self) -> bool:
        return self.quantize in ("int8", "uint8") and self.ranges is None

    def dense_type(self, model_dim: int) -> pa.DataType:
        """The Arrow type of the `dense` column for vectors of `model_dim` from the model."""
        dim = self.dim or model_dim
        if self.quantize in ("binary", "ubinary"):
            item = pa.int8() if self.quantize == "binary" else pa.uint8()
            return pa.list_(item, (dim + 7) // 8)
        if self.quantize is not None:
            return pa.list_(pa.int8() if self.quantize == "int8" else pa.uint8(), dim)
        return pa.list_(self._float(), dim)

    def multivector_type(self, dim: int) -> pa.DataType:
        return pa.list_(pa.list_(self._float(), dim))

    def _float(self) -> pa.DataType:
        return pa.float16() if self.dtype_out == "float16" else pa.float32()

    def truncate(self, dense: np.ndarray) -> np.ndarray:
        """`--dim` truncation, then L2 normalization again when the model normalizes. Models
        trained that way (Nomic) get a layer norm without weights before the cut."""
        if self.dim is None:
            return dense
        if self.layer_norm_before_dim:
            centered = dense - dense.mean(axis=1, keepdims=True)
            dense = centered / np.sqrt((centered**2).mean(axis=1, keepdims=True) + 1e-5)
        dense = dense[:, : self.dim]
        if self.normalize:
            norms = np.linalg.norm(dense, axis=1, keepdims=True)
            dense = dense / np.maximum(norms, 1e-12)
        return dense

    def calibrated(self, dense: np.ndarray) -> OutputFormat:
        """This format with int8/uint8 ranges taken from a sample of (untruncated) vectors."""
        if len(dense) < MIN_CALIBRATION_DOCUMENTS:
            raise BulkembedError(
                f"--quantize {self.quantize} calibrates on the first documents and needs at "
                f"least {MIN_CALIBRATION_DOCUMENTS}; this run has {len(dense)}"
            )
        sample = self.truncate(dense)
        return replace(self, ranges=np.vstack([sample.min(axis=0), sample.max(axis=0)]))

    def apply(self, embeddings: Embeddings) -> Embeddings:
        dense = embeddings.dense
        if dense is not None:
            dense = self._quantized(self.truncate(dense))
        multivector = embeddings.multivector
        if multivector is not None and self.dtype_out == "float16":
            multivector = [m.astype(np.float16, copy=False) for m in multivector]
        return Embeddings(dense, embeddings.sparse, multivector)

    def _quantized(self, dense: np.ndarray) -> np.ndarray:
        if self.quantize is None:
            return dense.astype(np.float16 if self.dtype_out == "float16" else np.float32)
        if self.quantize == "binary":
            return (np.packbits(dense > 0, axis=-1).astype(np.int16) - 128).astype(np.int8)
        if self.quantize == "ubinary":
            return np.packbits(dense > 0, axis=-1)
        assert self.ranges is not None, "int8 and uint8 need calibrated ranges"
        starts = self.ranges[0].astype(np.float32)
        steps = (self.ranges[1].astype(np.float32) - starts) / 255
        steps = np.where(steps == 0, 1, steps)
        levels = np.clip(np.floor((dense - starts) / steps), 0, 255)
        if self.quantize == "uint8":
            return levels.astype(np.uint8)
        return (levels - 128).astype(np.int8)

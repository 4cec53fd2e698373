"""The OpenVINO backend: the model's transformer converted once and run by OpenVINO's CPU
plugin, called like the PyTorch model it replaces.

The same Hugging Face weights are loaded in PyTorch, traced by `openvino.convert_model` on a
small padded example with dynamic batch and length, and saved as OpenVINO IR in the export
cache (`export_cache`), keyed by the model's exact weights and the versions that shaped the
conversion. Later runs read the IR and skip PyTorch's model load.

On the CPU its fused kernels (attention, layer norm, GELU; bfloat16 matrix multiplies on
AVX512-BF16 and AMX) run the packed batches 1.2-1.3× faster than PyTorch eager in float32
and 1.3× faster than autocast in bfloat16 (see the backend table in docs/design.md). Half precision
is OpenVINO's inference precision: the weights stay float32 in the IR, the plugin computes
in bfloat16 and returns float32.
"""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bulkembed.encoders.int8 import int8_settings
from bulkembed.encoders.openvino_import import import_openvino
from bulkembed.errors import ModelError
from bulkembed.models.export_cache import converted, installed_version
from bulkembed.models.model_files import find_model_config, read_json
from bulkembed.version import __version__

if TYPE_CHECKING:
    import torch

    from bulkembed.models.model_spec import ModelSpec

# The architectures whose conversion is tested against PyTorch and the reference libraries:
# `--backend auto` takes OpenVINO for these only (of CLIP and SigLIP, the image tower).
CONVERTED_MODEL_TYPES = frozenset({"bert", "roberta", "xlm-roberta", "clip", "siglip"})
# Bumped when the conversion changes what it writes, so that older folders are not used.
CONVERSION_FORMAT = 1
# Input shapes whose compiled kernels OpenVINO's CPU plugin keeps (its default: 5,000). Packed
# batches come in a few shapes that recur (full batches, one per padded length) and many
# that do not (a window's last batches): with the default, a run's memory grew by about
# 1 KB per document it embedded (950 MB over a million short documents), all of it kernels
# for shapes seen once. The shapes that recur stay among the last 500 used.
RUNTIME_CACHE_SHAPES = 500
# OpenVINO's names of the compute precisions bulkembed asks for.
_PRECISIONS = {"torch.float32": "f32", "torch.bfloat16": "bf16"}


def openvino_installed() -> bool:
    """Whether the `openvino` package can be imported."""
    return importlib.util.find_spec("openvino") is not None


def converts(model_type: str | None, dtype: torch.dtype) -> bool:
    """Whether OpenVINO runs a model of this `model_type` (config.json) in `dtype`."""
    return model_type in CONVERTED_MODEL_TYPES and str(dtype) in _PRECISIONS


@dataclass(frozen=True, slots=True)
class ModelOutput:
    """What the encoders read off a forward pass: the last hidden state, or the masked-LM
    logits of a SPLADE model."""

    last_hidden_state: torch.Tensor | None = None
    logits: torch.Tensor | None = None


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What the encoders read off a model's configuration (`model.config`), read from its
    `config.json`: the architectures converted all name both."""

    hidden_size: int
    vocab_size: int

    @classmethod
    def of(cls, spec: ModelSpec) -> ModelShape:
        path = find_model_config(spec.source, spec.revision)
        config = read_json(path) or {}
        try:
            return cls(int(config["hidden_size"]), int(config["vocab_size"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ModelError(f"{path} gives no hidden_size and vocab_size: {e}") from e


class OpenVINOModel:
    """A converted transformer compiled for the CPU in one precision: `model(input_ids=...,
    attention_mask=...)` returns `ModelOutput`, float32 tensors on the CPU."""

    def __init__(
        self,
        graph: Any,
        config: Any,
        masked_lm: bool,
        dtype: torch.dtype,
        threads: int,
        int8: Quantized | None = None,
    ) -> None:
        self.graph = graph
        self.config = config
        self.masked_lm = masked_lm
        self.dtype = dtype
        self.threads = threads
        # The graph quantized to int8 that runs instead of `graph`, if any.
        self.int8 = int8
        if int8 is None:
            self.compiled = compiled_for_cpu(graph, dtype, threads)
        else:
            self.compiled = compiled_for_cpu(int8.graph, dtype, threads, int8_settings(int8.mode))
        self.request = self.compiled.create_infer_request()

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> ModelOutput:
        import torch

        inputs = {"input_ids": input_ids.numpy(), "attention_mask": attention_mask.numpy()}
        result = torch.from_numpy(self.request.infer(inputs, share_inputs=True)[0])
        if self.masked_lm:
            return ModelOutput(logits=result)
        return ModelOutput(last_hidden_state=result)

    def in_dtype(self, dtype: torch.dtype) -> OpenVINOModel:
        """The same graph, not quantized, compiled to compute in `dtype`."""
        return OpenVINOModel(self.graph, self.config, self.masked_lm, dtype, self.threads)

    def in_int8(self, quantized: Quantized) -> OpenVINOModel:
        """The graph `quantized` from this one, compiled for the CPU."""
        import torch

        config, masked_lm = self.config, self.masked_lm
        return OpenVINOModel(self.graph, config, masked_lm, torch.float32, self.threads, quantized)


@dataclass(frozen=True, slots=True)
class Quantized:
    """A graph quantized to int8 in `mode` (`bulkembed.encoders.int8`)."""

    mode: str
    graph: Any


def conversion_key(spec: ModelSpec, head: str) -> dict[str, Any]:
    """What a conversion depends on: the model's exact weights (wherever they lie), the
    head (`base`, `masked-lm`, `image-tower`), and the versions of bulkembed and of the
    libraries that load, trace and convert it."""
    return {
        "format": CONVERSION_FORMAT,
        "weights": spec.version,
        "head": head,
        "bulkembed": __version__,
        **{name: installed_version(name) for name in ("openvino", "torch", "transformers")},
    }


def _example(vocabulary: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two documents of 16 tokens, the second padded after 10: the trace must see padding,
    or the mask's path could be left out of the graph."""
    import torch

    input_ids = (torch.arange(32, dtype=torch.long) % max(vocabulary, 1)).reshape(2, 16)
    attention_mask = torch.ones(2, 16, dtype=torch.long)
    attention_mask[1, 10:] = 0
    return input_ids, attention_mask


def converted_graph(source: str, module: Any, example: Any, shapes: list[Any]) -> Any:
    """`module` traced on `example` into an OpenVINO graph with the input `shapes`."""
    ov = import_openvino()
    import torch

    try:
        # The tracer warns of every Python branch it records; the graph is checked against
        # PyTorch by the tests, not by these.
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ov.convert_model(module, example_input=example, input=shapes)
    except Exception as e:
        # The converter raises its own error types, and torch's tracer others.
        raise ModelError(f"OpenVINO cannot convert {source}: {e}".splitlines()[0]) from e


def convert(load: Callable[[], Any], source: str, masked_lm: bool, folder: Path) -> None:
    """Trace the PyTorch model that `load()` returns (float32, on the CPU) with dynamic batch
    and length, and save the graph as `folder/model.xml` and `model.bin`."""
    ov = import_openvino()
    import torch

    model = load()

    class Outputs(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            out = self.model(input_ids=input_ids, attention_mask=attention_mask)
            return out.logits if masked_lm else out.last_hidden_state

    dynamic = [
        ("input_ids", [-1, -1], ov.Type.i64),
        ("attention_mask", [-1, -1], ov.Type.i64),
    ]
    example = _example(model.config.vocab_size)
    graph = converted_graph(source, Outputs(), example, dynamic)
    ov.save_model(graph, folder / "model.xml", compress_to_fp16=False)


def load_openvino(
    spec: ModelSpec,
    dtype: torch.dtype,
    masked_lm: bool,
    threads: int,
    load: Callable[[], Any],
    tell: Callable[[str], None],
) -> OpenVINOModel:
    """The model of `spec` compiled by OpenVINO for the CPU in `dtype`: converted from the
    PyTorch model `load()` returns into the export cache unless a valid conversion is there
    (`cached_graph`)."""
    config = ModelShape.of(spec)

    def build(into: Path) -> None:
        convert(load, spec.source, masked_lm, into)

    graph = cached_graph(spec, "masked-lm" if masked_lm else "base", build, tell)
    return OpenVINOModel(graph, config, masked_lm, dtype, threads)


def cached_graph(
    spec: ModelSpec, head: str, build: Callable[[Path], None], tell: Callable[[str], None]
) -> Any:
    """The OpenVINO graph of `spec`'s `head` (`conversion_key`) from the export cache,
    which `build` writes first unless a valid one is there. `tell` is told when one there
    is replaced, and when the cache cannot be written (the conversion is then made in a
    temporary folder, removed once read); a conversion that fails, or cannot be written
    there either, is a `ModelError`."""
    ov = import_openvino()

    def rebuilt(reason: str) -> None:
        tell(
            f"the cached OpenVINO conversion of {spec.source} is unusable ({reason}): "
            "converting it again"
        )

    def unwritable(reason: str) -> None:
        tell(
            f"the export cache {reason}: converting {spec.source} in a temporary folder for "
            "this run (set BULKEMBED_CACHE_DIR to a writable folder to convert it once)"
        )

    try:
        with converted("openvino", conversion_key(spec, head), build, rebuilt, unwritable) as f:
            return ov.Core().read_model(f / "model.xml")
    except (OSError, RuntimeError) as e:
        raise ModelError(f"OpenVINO cannot convert {spec.source}: {e}".splitlines()[0]) from e


def compiled_for_cpu(
    graph: Any, dtype: torch.dtype, threads: int, overrides: dict[str, Any] | None = None
) -> Any:
    """`graph` compiled for the CPU plugin to compute in `dtype` on `threads` threads, with
    the settings in `overrides` (an int8 graph's) taking the place of those."""
    ov = import_openvino()

    settings = {
        "INFERENCE_PRECISION_HINT": _PRECISIONS[str(dtype)],
        "PERFORMANCE_HINT": "LATENCY",
        "INFERENCE_NUM_THREADS": threads,
        "CPU_RUNTIME_CACHE_CAPACITY": RUNTIME_CACHE_SHAPES,
        **(overrides or {}),
    }
    return ov.Core().compile_model(graph, "CPU", settings)

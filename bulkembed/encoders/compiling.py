"""`torch.compile` for a run's model: whether a run compiles it when `--compile` was not
given (`compiles_by_default`), and the compiled model, its compiler's cache kept between
runs (`compiled`).

A compiled model fuses the elementwise work of each layer (bias and activation, residual
sum and norm) into fewer passes over memory; compiling costs seconds at the first batch (on
an H200, 19 s for BGE-M3 from nothing). So a run compiles by default only where the work
repays it: on CUDA, in PyTorch, when the inputs hold about five minutes of work or more for
an H100-class GPU. The work is estimated before the model loads from the inputs' bytes
(`BYTES_PER_TOKEN` to a token) and the model's config (`layer_parameters`): 2 FLOPs per
parameter of its layers per token, against `COMPILE_WORK_FLOPS`. Inputs of unknown size (a
streamed dataset, stdin) count as none. With `--engine ray` the devices are the cluster's,
unknown here: the default there compiles only where `--devices` names CUDA. `--compile`
and `--no-compile` decide it outright.

The compiler keeps what it built in a cache: `TORCHINDUCTOR_CACHE_DIR` where it is set,
else `torch-compile/` in bulkembed's cache folder (next to the converted models and the
recorded decisions), so that a later run of the same model compiles from it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from bulkembed.models.file_digests import cache_root
from bulkembed.models.model_files import find_model_config, read_json

if TYPE_CHECKING:
    from bulkembed.models.model_spec import ModelSpec

# About five minutes of an H100-class GPU at 330 TFLOP/s (bfloat16 at MFU 0.33), against a
# compile of about 20 s from nothing and a few seconds from its cache.
COMPILE_WORK_FLOPS = 1e17
# Bytes of text per token of English prose under WordPiece and SentencePiece vocabularies
# (about 4); a compressed input holds more tokens than this says.
BYTES_PER_TOKEN = 4
CACHE_VARIABLE = "TORCHINDUCTOR_CACHE_DIR"


def layer_parameters(config: dict[str, Any]) -> int:
    """The parameters of a transformer's layers, from its config: per layer 4 · hidden²
    (attention) and 2 · hidden · inner (feed-forward); 0 where the config does not say.

    >>> layer_parameters({"num_hidden_layers": 24, "hidden_size": 1024, "intermediate_size": 4096})
    301989888
    """
    hidden = int(config.get("hidden_size") or config.get("n_embd") or 0)
    layers = int(config.get("num_hidden_layers") or config.get("n_layer") or 0)
    inner = int(config.get("intermediate_size") or 4 * hidden)
    return layers * (4 * hidden * hidden + 2 * hidden * inner)


def compiles_by_default(spec: ModelSpec, device: str, input_bytes: int) -> bool:
    """Whether a run of `spec` on `device` over inputs of `input_bytes` compiles its model
    when `--compile` was not given (see the module's docstring)."""
    if not device.startswith("cuda") or spec.backend == "openvino":
        return False
    config = read_json(find_model_config(spec.source, spec.revision, spec.recipe))
    work = 2 * layer_parameters(config) * input_bytes / BYTES_PER_TOKEN
    return work >= COMPILE_WORK_FLOPS


def compiled(model: Any) -> Any:
    """`model` compiled by `torch.compile` for any shape (batch sizes and lengths change from
    batch to batch, so it compiles once rather than for each shape), its compiler's cache
    in bulkembed's cache folder unless `TORCHINDUCTOR_CACHE_DIR` says otherwise."""
    import torch

    os.environ.setdefault(CACHE_VARIABLE, str(cache_root() / "torch-compile"))
    return torch.compile(model, dynamic=True)

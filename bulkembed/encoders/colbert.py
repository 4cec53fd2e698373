"""ColBERT models in the PyLate layout: one normalized vector per document token.

The folder holds a transformer, then a sentence-transformers `Dense` module that projects
each token's hidden state (typically to 128 dimensions). Every document gets a marker token
(`[D] `) after its first token; the vectors of punctuation (the model's skip list) are
dropped, as are padding tokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from bulkembed.encoders.backend import load_state
from bulkembed.encoders.base import Encoder
from bulkembed.encoders.transfer import DeviceInputs, DeviceOutputs
from bulkembed.errors import ModelError
from bulkembed.models.model_files import model_file, read_json

if TYPE_CHECKING:
    from bulkembed.models.model_spec import ModelSpec

_IDENTITY = ("torch.nn.modules.linear.Identity", "torch.nn.Identity")


def _load_projection(spec: ModelSpec, dtype: torch.dtype) -> torch.nn.Linear:
    """The Dense module's linear layer; only the identity activation is supported."""
    assert spec.projection is not None
    folder = spec.projection
    config = read_json(model_file(spec.source, spec.revision, f"{folder}/config.json")) or {}
    activation = config.get("activation_function", _IDENTITY[0])
    if activation not in _IDENTITY:
        raise ModelError(f"{spec.source}/{folder}: activation {activation} is not supported")
    if config.get("use_residual"):
        raise ModelError(f"{spec.source}/{folder}: a residual Dense module is not supported")
    weights = model_file(spec.source, spec.revision, f"{folder}/model.safetensors")
    if weights is not None:
        from safetensors.torch import load_file

        state = load_file(str(weights))
    else:
        weights = model_file(spec.source, spec.revision, f"{folder}/pytorch_model.bin")
        if weights is None:
            raise ModelError(f"{spec.source}/{folder} holds no weights")
        state = load_state(weights)
    out_features, in_features = state["linear.weight"].shape
    linear = torch.nn.Linear(in_features, out_features, bias="linear.bias" in state, dtype=dtype)
    linear.load_state_dict({k.removeprefix("linear."): v for k, v in state.items()})
    return linear


class ColbertEncoder(Encoder):
    """Multi-vector output: projected, L2-normalized token vectors, punctuation dropped."""

    runs_flat = True

    def __init__(self, spec: ModelSpec, device: str, dtype: torch.dtype) -> None:
        super().__init__(spec, device, dtype)
        self.model = self.load_transformer()
        self.projection = _load_projection(spec, self.weights_dtype).to(device)
        self.skipped = np.array(spec.skip_token_ids, dtype=np.int64)

    @property
    def multivector_dim(self) -> int:
        return self.projection.out_features

    def embed(self, inputs: DeviceInputs) -> DeviceOutputs:
        tokens = inputs.hidden_states(self.model)
        vectors = F.normalize(self.projection(tokens).float(), dim=-1)
        # Which rows are kept is known from the ids the host holds: no wait for the device.
        keep = ~np.isin(inputs.batch.token_ids, self.skipped)
        return DeviceOutputs(multivector=vectors.to(self.multivector_dtype), multivector_keep=keep)

"""Two towers into one space: CLIP and SigLIP (`transformers` `CLIPModel`, `SiglipModel`).

A batch of images runs through the image tower (`get_image_features`): the worker's uint8
pixels become the processor's pixel values on the device, through a table of what each
byte of each channel becomes (`ImageProcessing.table`). A batch of texts runs through the
text tower (`get_text_features`): CLIP reads its padded batch with the attention mask and
pools at the end-of-text token; SigLIP was trained on texts padded to their full length
and pools the last position, so its texts are padded to the maximum length, as its
processor pads them (`padding="max_length"`). Vectors are L2-normalized where the recipe
says, as the models' cards compare them. On a CPU the image tower runs in OpenVINO where
`--backend` allows (`image_towers`), the text tower in PyTorch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from bulkembed.config import Backend
from bulkembed.contracts import TokenBatch
from bulkembed.encoders.backend import choose_backend, load_model
from bulkembed.encoders.base import Encoder
from bulkembed.encoders.image_towers import TwoTowers, openvino_image_tower
from bulkembed.encoders.runtime import PROBE_TOKENS
from bulkembed.encoders.transfer import DeviceInputs, DeviceOutputs
from bulkembed.errors import ModelError

if TYPE_CHECKING:
    from bulkembed.models.model_spec import ModelSpec

# Architectures (config.json `model_type`) whose texts are padded to the maximum length.
PADDED_TEXTS = frozenset({"siglip"})


class ClipEncoder(Encoder):
    """One vector per image or text, from the tower that reads it."""

    def __init__(self, spec: ModelSpec, device: str, dtype: torch.dtype) -> None:
        super().__init__(spec, device, dtype)
        model = load_model(spec, device, self.weights_dtype)
        self.model = TwoTowers(model)
        if choose_backend(spec, device, dtype) is Backend.OPENVINO:
            threads = torch.get_num_threads()
            try:
                images = openvino_image_tower(spec, model, dtype, threads, self.notices.append)
            except ModelError as e:
                if spec.backend != Backend.AUTO.value:
                    raise
                self.notices.append(f"{e}; running its image tower in PyTorch instead")
            else:
                # OpenVINO takes the compute precision; the text tower runs in float32.
                self.model, self.backend, self.autocast = (
                    TwoTowers(model, images),
                    Backend.OPENVINO,
                    False,
                )
        assert spec.image is not None, "a two-tower model's spec has its image preprocessing"
        self.table = torch.from_numpy(spec.image.table()).to(device)
        self.channels = torch.arange(3, device=device)

    @property
    def dense_dim(self) -> int | None:
        return self.spec.dense_dim

    def probe_batch(self) -> TokenBatch:
        """The batch the budget probe measures (`--max-batch-tokens auto`): images, which
        runs of a two-tower model embed, as many as `PROBE_TOKENS` of their tokens."""
        assert self.spec.image is not None
        tokens = self.spec.image.tokens
        images = max(2, PROBE_TOKENS // tokens)
        lengths = np.full(images, tokens, dtype=np.int32)
        pixels = np.zeros((images, *self.spec.image.shape, 3), dtype=np.uint8)
        return TokenBatch(np.zeros(images * tokens, np.int32), lengths, pixels)

    def padded_width(self, longest: int) -> int:
        """SigLIP's texts are as long as its maximum length (`PADDED_TEXTS`)."""
        if self.spec.model_type in PADDED_TEXTS and longest <= self.spec.max_length:
            return self.spec.max_length
        return super().padded_width(longest)

    def embed(self, inputs: DeviceInputs) -> DeviceOutputs:
        if inputs.pixels is not None:
            # [images, height, width, 3] bytes -> [images, 3, height, width] pixel values.
            values = self.table[self.channels, inputs.pixels.long()].permute(0, 3, 1, 2)
            output = self.model.image_features(values.to(self.weights_dtype))
        else:
            mask = None if self.spec.model_type in PADDED_TEXTS else inputs.attention_mask
            output = self.model.text_features(inputs.input_ids, mask)
        vectors = output.float()
        if self.spec.normalize:
            vectors = F.normalize(vectors, p=2, dim=1)
        return DeviceOutputs(dense=vectors)

"""The two-tower encoder: its image tower in OpenVINO and in PyTorch, a batch of images
halved, and the batch the budget probe measures."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import cosines

from bulkembed.config import RunConfig
from bulkembed.contracts import TokenBatch
from bulkembed.encoders.registry import build_encoder
from bulkembed.models.model_spec import resolve_model


def _spec(model, backend="auto"):
    return resolve_model(RunConfig(inputs=("x",), output="o", model=str(model), backend=backend))


def _batch(spec, photos, count):
    assert spec.image is not None
    pixels = np.stack([spec.image.pixels(p.read_bytes()) for p in photos[:count]])
    lengths = np.full(count, spec.image.tokens, np.int32)
    return TokenBatch(np.zeros(int(lengths.sum()), np.int32), lengths, pixels)


@pytest.mark.parametrize("model", ["tiny_clip", "tiny_siglip"])
def test_the_openvino_image_tower_gives_pytorchs_vectors(model, photos, request):
    folder = request.getfixturevalue(model)
    torch_encoder = build_encoder(_spec(folder, "torch"), "cpu", torch.float32)
    openvino_encoder = build_encoder(_spec(folder, "openvino"), "cpu", torch.float32)
    assert (torch_encoder.backend.value, openvino_encoder.backend.value) == ("torch", "openvino")
    batch = _batch(torch_encoder.spec, photos, 12)
    expected = torch_encoder.embed_batch(batch).dense
    found = openvino_encoder.embed_batch(batch).dense
    assert cosines(found, expected).min() >= 0.9999
    # Halved, as a batch out of memory is: the same vectors, in order.
    first, second = batch.halves()
    assert first.pixels is not None and second.pixels is not None
    assert (len(first), len(second), len(first.pixels), len(second.pixels)) == (6, 6, 6, 6)
    halves = np.concatenate([torch_encoder.embed_batch(h).dense for h in (first, second)])
    assert np.allclose(halves, expected, atol=1e-6)


def test_the_budget_probe_measures_a_batch_of_images(tiny_clip):
    encoder = build_encoder(_spec(tiny_clip, "torch"), "cpu", torch.float32)
    probe = encoder.probe_batch()
    assert probe.pixels is not None and probe.pixels.shape == (163, 224, 224, 3)
    assert set(probe.lengths.tolist()) == {50}
    assert encoder.embed_batch(probe).dense.shape == (163, 24)

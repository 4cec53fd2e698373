"""Padded batches on CUDA are padded to their longest document's bucket (a few shapes a run),
not to the longest itself: the vectors are those of a batch padded to the longest."""

import pytest
import torch
from helpers import sample_texts

from bulkembed.batching.tokenize import TextTokenizer, TokenizerSettings
from bulkembed.config import RunConfig
from bulkembed.contracts import TokenBatch
from bulkembed.encoders import build_encoder
from bulkembed.encoders.transfer import DeviceInputs, bucketed_width
from bulkembed.models.model_spec import resolve_model


def _encoder_and_batch(folder, **options):
    config = RunConfig(
        inputs=("x",), output="out", model=str(folder), attention="padded", backend="torch",
        max_length=128, **options,
    )  # fmt: skip
    spec = resolve_model(config)
    tokenizer = TextTokenizer(TokenizerSettings(spec.tokenizer_json, spec.max_length, spec.prompt))
    texts = [
        " ".join(t.split()[:k]) for t, k in zip(sample_texts(6), (25, 3, 12, 18, 7, 1), strict=True)
    ]
    ids, lengths, _ = tokenizer(texts)
    return build_encoder(spec, "cpu", torch.float32), TokenBatch(ids, lengths)


def _outputs(encoder, batch, width):
    inputs = DeviceInputs.padded(batch, encoder.spec.pad_token_id, width)
    assert inputs.input_ids.shape == (len(batch.lengths), width or batch.lengths.max())
    with torch.inference_mode():
        return encoder.embed(inputs)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_dense_vectors_of_a_batch_padded_to_its_bucket_are_those_padded_to_its_longest(
    tiny_st, pooling
):
    encoder, batch = _encoder_and_batch(tiny_st(pooling))
    longest = int(batch.lengths.max())
    width = bucketed_width(longest, 128)
    assert longest < width <= 128
    torch.testing.assert_close(
        _outputs(encoder, batch, width).dense, _outputs(encoder, batch, None).dense,
        atol=1e-6, rtol=1e-6,
    )  # fmt: skip


def test_splade_weights_of_a_batch_padded_to_its_bucket_are_those_padded_to_its_longest(
    tiny_splade,
):
    encoder, batch = _encoder_and_batch(tiny_splade)
    width = bucketed_width(int(batch.lengths.max()), 128)
    assert width > batch.lengths.max()
    wider, longest = _outputs(encoder, batch, width), _outputs(encoder, batch, None)
    assert wider.reduced_from[0].shape == longest.reduced_from[0].shape
    torch.testing.assert_close(wider.reduced_from[0], longest.reduced_from[0], atol=1e-5, rtol=0)


def test_only_cuda_pads_to_the_bucket(tiny_st, monkeypatch):
    encoder, batch = _encoder_and_batch(tiny_st("mean"))
    assert encoder.padded_width(70) == 70
    assert encoder.upload(batch).input_ids.shape[1] == int(batch.lengths.max())
    assert encoder.cost(batch) == batch.padded_tokens
    monkeypatch.setattr(encoder, "device", "cuda:0")
    assert [encoder.padded_width(n) for n in (70, 90, 127)] == [72, 96, 128]
    width = bucketed_width(int(batch.lengths.max()), 128)
    assert encoder.cost(batch) == len(batch.lengths) * width > batch.padded_tokens

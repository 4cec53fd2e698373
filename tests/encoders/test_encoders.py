import numpy as np
import pytest
import torch
from helpers import cosines, sample_texts

from bulkembed.batching.tokenize import TextTokenizer, TokenizerSettings
from bulkembed.config import RunConfig
from bulkembed.encoders import (
    DeviceInputs,
    DeviceOutputs,
    Encoder,
    TokenBatch,
    build_encoder,
    register_encoder,
)
from bulkembed.encoders.pooling import cls_pool, last_token_pool, mean_pool
from bulkembed.encoders.varlen import Sequences
from bulkembed.errors import ModelError
from bulkembed.models.model_spec import resolve_model


def _embed(folder, texts, **options) -> np.ndarray:
    spec = resolve_model(RunConfig(inputs=("x",), output="out", model=str(folder), **options))
    encoder = build_encoder(spec, "cpu", torch.float32)
    tokenizer = TextTokenizer(TokenizerSettings(spec.tokenizer_json, spec.max_length, spec.prompt))
    flat, lengths, _ = tokenizer(texts)
    return encoder.embed_batch(TokenBatch(flat, lengths)).dense


@pytest.mark.parametrize("backend", ["torch", "openvino"])
@pytest.mark.parametrize("mode", ["cls", "mean", "lasttoken"])
def test_tiny_model_matches_sentence_transformers(tiny_st, mode, backend):
    from sentence_transformers import SentenceTransformer

    folder = tiny_st(mode)
    texts = sample_texts(40)
    ours = _embed(folder, texts, backend=backend)
    reference = SentenceTransformer(str(folder), device="cpu").encode(
        texts, batch_size=8, convert_to_numpy=True
    )
    assert ours.shape == reference.shape == (40, 32)
    assert cosines(ours, reference).min() >= 0.99999
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, rtol=1e-5)


def test_unnormalized_output_keeps_its_length(tiny_st):
    from sentence_transformers import SentenceTransformer

    folder = tiny_st("mean", normalize=False)
    texts = sample_texts(10)
    reference = SentenceTransformer(str(folder), device="cpu").encode(texts)
    np.testing.assert_allclose(_embed(folder, texts), reference, rtol=1e-4, atol=1e-5)


def test_padding_does_not_change_a_vector(tiny_st):
    texts = sample_texts(12)
    together = _embed(tiny_st("mean"), texts)
    alone = np.stack([_embed(tiny_st("mean"), [t])[0] for t in texts])
    assert cosines(together, alone).min() >= 0.99999


def test_pooling_functions_against_hand_computed_values():
    # Three documents end to end: two tokens, none, three tokens.
    tokens = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0], [9.0, 10.0]])
    sequences = Sequences.on_host(np.array([2, 0, 3]))
    before = tokens.clone()
    assert cls_pool(tokens, sequences).tolist() == [[1.0, 2.0], [0.0, 0.0], [5.0, 6.0]]
    assert mean_pool(tokens, sequences).tolist() == [[2.0, 3.0], [0.0, 0.0], [7.0, 8.0]]
    assert last_token_pool(tokens, sequences).tolist() == [[3.0, 4.0], [0.0, 0.0], [9.0, 10.0]]
    assert torch.equal(tokens, before)


def test_pooling_accumulates_in_float32():
    # Four float16 values of 60000 sum past float16's largest value (65504).
    tokens = torch.full((4, 2), 60000.0, dtype=torch.float16)
    pooled = mean_pool(tokens, Sequences.on_host(np.array([4])))
    assert pooled.dtype == torch.float32
    assert pooled.tolist() == [[60000.0, 60000.0]]


class _LengthEncoder(Encoder):
    """Embeds a document as [length, first token id]: easy to check where rows went."""

    family = "length-test"

    @property
    def dense_dim(self) -> int:
        return 2

    def embed(self, inputs: DeviceInputs) -> DeviceOutputs:
        batch = inputs.batch
        starts = np.cumsum(batch.lengths) - batch.lengths
        firsts = batch.token_ids[starts]
        dense = np.stack([batch.lengths, firsts], axis=1).astype(np.float32)
        return DeviceOutputs(dense=torch.from_numpy(dense))


def test_registry_builds_registered_and_built_in_families(tiny_st):
    register_encoder("length-test", _LengthEncoder)
    spec = resolve_model(RunConfig(inputs=("x",), output="o", model=str(tiny_st("mean"))))
    from dataclasses import replace

    encoder = build_encoder(replace(spec, family="length-test"), "cpu", torch.float32)
    out = encoder.embed_batch(TokenBatch.from_sequences([np.array([5, 6, 7]), np.array([9])]))
    assert out.dense.tolist() == [[3.0, 5.0], [1.0, 9.0]]
    with pytest.raises(ModelError, match="unknown model family 'nope'"):
        build_encoder(replace(spec, family="nope"), "cpu", torch.float32)


def test_padded_tensors_use_the_pad_id_and_mask():
    batch = TokenBatch.from_sequences([np.array([9]), np.array([5, 6, 7])])
    inputs = DeviceInputs.padded(batch, pad_token_id=0)
    assert inputs.input_ids.tolist() == [[9, 0, 0], [5, 6, 7]]
    assert inputs.attention_mask.tolist() == [[1, 0, 0], [1, 1, 1]]
    # Where each real token is in the padded ids, laid flat: they read back the batch.
    assert inputs.token_index.tolist() == [0, 3, 4, 5]
    assert inputs.token_ids.tolist() == [9, 5, 6, 7]
    flat = DeviceInputs.flat(batch)
    assert flat.input_ids.tolist() == [9, 5, 6, 7]
    assert flat.attention_mask is None
    assert flat.sequences.cu_seqlens.tolist() == [0, 1, 4]

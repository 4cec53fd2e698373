"""The device hot path: sparse weights reduced on the device, batches run back to back
(the next one uploaded before the last one lands), outputs split on the host."""

from dataclasses import replace

import numpy as np
import pyarrow as pa
import pytest
import torch
from helpers import cosines, sample_texts
from hypothesis import given, settings
from hypothesis import strategies as st

from bulkembed.batching.tokenize import TextTokenizer, TokenizedChunk, TokenizerSettings
from bulkembed.batching.windows import embed_packed
from bulkembed.config import DType, RunConfig
from bulkembed.contracts import SparseRows, SparseVector
from bulkembed.encoders import DeviceInputs, DeviceOutputs, Encoder, TokenBatch, build_encoder
from bulkembed.encoders.sparse import keep_top_k, max_weight_per_id
from bulkembed.models.model_spec import resolve_model
from bulkembed.reporting.progress import QuietReporter, RunStats
from bulkembed.sources.records import Chunk


def _per_document(weights, token_ids, excluded, top_k=None) -> SparseVector:
    """The reference, one document at a time on the host: for each id the largest
    weight, ids in `excluded` and weights <= 0 dropped, ascending by id, the `top_k`
    largest (lowest id first among equals)."""
    keep = (weights > 0) & ~np.isin(token_ids, excluded)
    ids, kept = token_ids[keep], weights[keep]
    if len(ids) == 0:
        return SparseVector(np.empty(0, np.int32), np.empty(0, np.float32))
    order = np.argsort(ids, kind="stable")
    ids, kept = ids[order], kept[order]
    unique, starts = np.unique(ids, return_index=True)
    values = np.maximum.reduceat(kept, starts).astype(np.float32)
    if top_k is not None and len(unique) > top_k:
        best = np.sort(np.argsort(-values, kind="stable")[:top_k])
        unique, values = unique[best], values[best]
    return SparseVector(unique.astype(np.int32), values)


@pytest.mark.parametrize("top_k", [None, 1, 3, 100])
@pytest.mark.parametrize("seed", range(5))
def test_sparse_weights_reduced_on_the_device_equal_the_per_document_result(seed, top_k):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 41, 7)
    tokens = int(lengths.sum())
    # Few distinct ids and weights rounded to tenths: many repeats and ties.
    token_ids = rng.integers(0, 12, tokens)
    weights = np.round(rng.normal(0.2, 0.5, tokens), 1).astype(np.float32)
    excluded = np.array([0, 2])
    documents = np.repeat(np.arange(len(lengths)), lengths)
    keep = ~np.isin(token_ids, excluded)

    found = max_weight_per_id(
        torch.from_numpy(weights),
        torch.from_numpy(token_ids),
        torch.from_numpy(documents),
        torch.from_numpy(keep),
        top_k,
    )
    entries, ids, reduced = (t.numpy() for t in found)
    present = reduced > 0
    # Entries come by document, then by ascending id.
    order = entries[present] * 100 + ids[present]
    assert (np.diff(order) > 0).all()
    ends = np.cumsum(lengths)
    for document, n in enumerate(lengths):
        span = slice(ends[document] - n, ends[document])
        expected = _per_document(weights[span], token_ids[span], excluded, top_k)
        mine = present & (entries == document)
        assert ids[mine].tolist() == expected.indices.tolist()
        assert reduced[mine].tolist() == expected.values.tolist()


def test_keep_top_k_keeps_the_largest_and_the_lowest_id_among_equals():
    weights = torch.tensor([[0.2, 0.7, 0.7, 0.0, 0.7], [0.0, 0.0, 0.1, 0.0, 0.0]])
    assert keep_top_k(weights, 2).tolist() == [
        [0.0, pytest.approx(0.7), pytest.approx(0.7), 0.0, 0.0],
        [0.0, 0.0, pytest.approx(0.1), 0.0, 0.0],
    ]


class _Recording(Encoder):
    """Records when batches are uploaded and run; embeds a document as its length."""

    events: list[str]

    @property
    def dense_dim(self) -> int:
        return 1

    def upload(self, batch: TokenBatch) -> DeviceInputs:
        self.events.append(f"upload {int(batch.lengths[0])}")
        return super().upload(batch)

    def embed(self, inputs: DeviceInputs) -> DeviceOutputs:
        self.events.append(f"run {int(inputs.batch.lengths[0])}")
        return DeviceOutputs(dense=inputs.attention_mask.sum(dim=1, keepdim=True).float())


def test_the_next_batch_is_uploaded_and_run_before_the_last_one_lands(tiny_st):
    spec = resolve_model(RunConfig(inputs=("x",), output="o", model=str(tiny_st("mean"))))
    encoder = _Recording(spec, "cpu", torch.float32)
    encoder.events = []
    batches = [TokenBatch.from_sequences([np.arange(n)] * 2) for n in (3, 2, 1)]

    def finished(key: int, seconds: float, host_seconds: float) -> None:
        encoder.events.append(f"landed {key}")
        assert seconds >= 0 and host_seconds >= 0

    outputs = list(encoder.embed_stream(((int(b.lengths[0]), b) for b in batches), finished))
    assert [(key, o.dense[:, 0].tolist()) for key, o in outputs] == [
        (3, [3, 3]),
        (2, [2, 2]),
        (1, [1, 1]),
    ]
    assert encoder.events == [
        "upload 3",
        "run 3",
        "upload 2",
        "run 2",
        "upload 1",
        "landed 3",
        "run 1",
        "landed 2",
        "landed 1",
    ]


def test_the_next_window_is_packed_before_the_last_batch_of_one_lands(tiny_st):
    spec = resolve_model(RunConfig(inputs=("x",), output="o", model=str(tiny_st("mean"))))
    encoder = _Recording(spec, "cpu", torch.float32)
    encoder.events = []

    def windows():
        for length in (4, 3):
            encoder.events.append(f"window {length}")
            chunk = Chunk(0, 0, pa.array(["a", "b"]), pa.array([], pa.string()), False)
            tokens = np.arange(2 * length, dtype=np.int32)
            lengths = np.array([length, length], np.int32)
            yield [TokenizedChunk(chunk, tokens, lengths, np.zeros(2, bool))]

    embedded = embed_packed(windows(), encoder, 100, RunStats(), QuietReporter())
    found = [packed.embedded()[0].dense[:, 0].tolist() for packed in embedded]
    assert found == [[4, 4], [3, 3]]
    # Window 3 is gathered and its batch uploaded while window 4's batch is out.
    assert encoder.events == ["window 4", "upload 4", "run 4", "window 3", "upload 3", "run 3"]


def test_windows_with_nothing_to_embed_go_on_without_waiting_for_the_next_batch(tiny_st):
    spec = resolve_model(RunConfig(inputs=("x",), output="o", model=str(tiny_st("mean"))))
    encoder = _Recording(spec, "cpu", torch.float32)
    encoder.events = []

    def window(length: int) -> list[TokenizedChunk]:
        chunk = Chunk(0, 0, pa.array(["a"] if length else []), pa.array([], pa.string()), False)
        lengths = np.array([length] if length else [], np.int32)
        truncated = np.zeros(len(lengths), bool)
        return [TokenizedChunk(chunk, np.arange(length, dtype=np.int32), lengths, truncated)]

    def windows():
        for number, length in enumerate([3] + [0] * 100 + [2]):
            encoder.events.append(f"window {number}")
            yield window(length)

    embedded = embed_packed(windows(), encoder, 100, RunStats(), QuietReporter())
    assert len(next(embedded).batches) == 1
    # The first window comes out after a look at most two windows ahead, not a hundred.
    assert encoder.events[-1] in ("window 1", "window 2")
    rest = list(embedded)
    assert len(rest) == 101 and [len(p.batches) for p in rest[-2:]] == [0, 1]


def _batches(spec, texts: list[str], size: int) -> list[TokenBatch]:
    tokenizer = TextTokenizer(TokenizerSettings(spec.tokenizer_json, spec.max_length))
    batches = []
    for start in range(0, len(texts), size):
        flat, lengths, _ = tokenizer(texts[start : start + size])
        batches.append(TokenBatch(flat, lengths))
    return batches


@pytest.mark.parametrize("dtype_out", ["float32", "float16"])
def test_batches_run_back_to_back_give_what_each_gives_alone(tiny_bge_m3, dtype_out):
    config = RunConfig(inputs=("x",), output="o", model=str(tiny_bge_m3), dtype_out=dtype_out)
    spec = resolve_model(config)
    encoder = build_encoder(spec, "cpu", torch.float32)
    batches = _batches(spec, sample_texts(24), 5)
    together = encoder.embed_stream(enumerate(batches), lambda *_: None)
    reference = build_encoder(replace(spec, multivector_dtype="float32"), "cpu", torch.float32)
    for (number, found), batch in zip(together, batches, strict=True):
        alone = reference.embed_batch(batches[number])
        assert np.array_equal(found.dense, alone.dense)
        for a, b in zip(found.sparse, alone.sparse, strict=True):
            assert np.array_equal(a.indices, b.indices) and np.array_equal(a.values, b.values)
        assert [len(m) for m in found.multivector] == [int(n) - 1 for n in batch.lengths]
        for a, b in zip(found.multivector, alone.multivector, strict=True):
            # float16 rows are the float32 rows rounded once.
            assert a.dtype == np.dtype(dtype_out)
            assert np.array_equal(a, b.astype(dtype_out))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("attention", ["flat", "padded"])
def test_cuda_batches_run_back_to_back_in_half_precision_match_the_cpu(tiny_bge_m3, attention):
    from bulkembed.models.devices import resolve_dtype

    spec = resolve_model(
        RunConfig(inputs=("x",), output="o", model=str(tiny_bge_m3), attention=attention)
    )
    batches = _batches(spec, sample_texts(40), 8)
    half = resolve_dtype(DType.AUTO, "cuda:0")
    cuda = build_encoder(spec, "cuda:0", half)
    assert cuda.unpadded == (attention == "flat")
    cpu = build_encoder(spec, "cpu", torch.float32)
    streamed = [e for _, e in cuda.embed_stream(enumerate(batches), lambda *_: None)]
    expected = [cpu.embed_batch(batch) for batch in batches]
    for a, b in zip(streamed, expected, strict=True):
        assert cosines(a.dense, b.dense).min() >= 0.999
        for x, y in zip(a.multivector, b.multivector, strict=True):
            assert cosines(x, y).min() >= 0.99
    # The stream gives what the same encoder gives batch by batch, exactly.
    for a, batch in zip(streamed, batches, strict=True):
        assert np.array_equal(a.dense, cuda.embed_batch(batch).dense)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_outputs_copied_back_on_their_own_stream_equal_those_on_the_compute_stream(
    tiny_bge_m3, monkeypatch
):
    from bulkembed.encoders.transfer import COPY_BACK_VARIABLE

    outputs = ("dense", "sparse", "multivector")
    config = RunConfig(inputs=("x",), output="o", model=str(tiny_bge_m3), outputs=outputs)
    spec = resolve_model(config)
    batches = _batches(spec, sample_texts(40), 8)
    found = {}
    for way in ("side", "compute"):
        monkeypatch.setenv(COPY_BACK_VARIABLE, way)
        encoder = build_encoder(spec, "cuda:0", torch.bfloat16)
        assert (encoder._landings is not None) == (way == "side")
        found[way] = [e for _, e in encoder.embed_stream(enumerate(batches), lambda *_: None)]
    for a, b in zip(found["side"], found["compute"], strict=True):
        assert np.array_equal(a.dense, b.dense)
        for name in ("indices", "values", "offsets"):
            assert np.array_equal(getattr(a.sparse, name), getattr(b.sparse, name))
        assert all(np.array_equal(x, y) for x, y in zip(a.multivector, b.multivector, strict=True))


@given(
    st.lists(st.lists(st.integers(0, 50), max_size=6, unique=True), max_size=8),
    st.data(),
)
@settings(max_examples=200, deadline=None)
def test_sparse_rows_hold_each_document_s_entries_as_a_list_of_vectors_would(documents, data):
    """Flat rows taken, sliced, indexed and joined give what the same operations give on a
    list of one vector per document."""
    vectors = [
        SparseVector(np.array(sorted(ids), np.int32), np.array(sorted(ids), np.float32) / 7)
        for ids in documents
    ]
    rows = SparseRows.of(vectors)

    def same(found, expected):
        assert len(found) == len(expected)
        for ours, theirs in zip(found, expected, strict=True):
            np.testing.assert_array_equal(ours.indices, theirs.indices)
            np.testing.assert_array_equal(ours.values, theirs.values)

    same(rows, vectors)
    if vectors:
        picked = data.draw(st.lists(st.integers(0, len(vectors) - 1), max_size=10))
        same(rows.take(np.array(picked, np.int64)), [vectors[i] for i in picked])
        same([rows[-1]], [vectors[-1]])
    start, stop = data.draw(st.integers(0, 8)), data.draw(st.integers(0, 8))
    same(rows[start:stop], vectors[start:stop])
    cut = data.draw(st.integers(0, len(vectors)))
    joined = SparseRows.concatenate([SparseRows.of(vectors[:cut]), SparseRows.of(vectors[cut:])])
    same(joined, vectors)
    assert joined.offsets.tolist() == rows.offsets.tolist()
    with pytest.raises(IndexError):
        rows[len(vectors)]


def test_weights_go_straight_to_a_gpu_and_load_alike_that_way(tiny_splade, monkeypatch):
    import importlib.util

    import transformers

    from bulkembed.encoders import backend

    assert backend.placement("cpu") == {}
    # transformers 5 places weights alone; before, with accelerate installed.
    alone = int(transformers.__version__.split(".")[0]) >= 5
    can = alone or importlib.util.find_spec("accelerate") is not None
    assert backend.placement("cuda:1") == ({"device_map": "cuda:1"} if can else {})
    # The same load placed by `device_map` (here on the CPU) gives the same weights, with
    # every other option of the load (a masked-LM head, its dtype, the loading report).
    spec = resolve_model(RunConfig(inputs=("x",), output="o", model=str(tiny_splade)))
    moved = backend.load_model(spec, "cpu", torch.float32, masked_lm=True)
    monkeypatch.setattr(backend, "placement", lambda device: {"device_map": device})
    placed = backend.load_model(spec, "cpu", torch.float32, masked_lm=True)
    expected = moved.state_dict()
    assert placed.state_dict().keys() == expected.keys()
    for name, tensor in placed.state_dict().items():
        assert torch.equal(tensor, expected[name]), name

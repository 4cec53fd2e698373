"""Flat (unpadded) batches: the same vectors as padded batches and as the reference
libraries, the CUDA kernel's wiring, no [documents, length, length] tensor, and which
layout a run takes."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import (
    SAMPLE,
    bge_m3_reference,
    cosines,
    mixed_texts,
    read_output,
    run_cli,
    sample_texts,
    write_jsonl,
)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from bulkembed import embed_corpus
from bulkembed.batching.tokenize import TextTokenizer, TokenizerSettings
from bulkembed.config import Attention, Backend, DType, RunConfig
from bulkembed.contracts import RUN_DIRECTORY
from bulkembed.encoders import TokenBatch, build_encoder
from bulkembed.encoders.backend import choose_backend
from bulkembed.encoders.openvino import openvino_installed
from bulkembed.encoders.varlen import Sequences
from bulkembed.errors import UsageError
from bulkembed.models.model_spec import resolve_model
from bulkembed.reporting.printing import summary_lines


def _spec(folder: Path, **options):
    return resolve_model(RunConfig(inputs=("x",), output="out", model=str(folder), **options))


def _batch(spec, texts: list[str]) -> TokenBatch:
    tokenizer = TextTokenizer(TokenizerSettings(spec.tokenizer_json, spec.max_length, spec.prompt))
    flat, lengths, _ = tokenizer(texts)
    return TokenBatch(flat, lengths)


def _by_layout(folder: Path, batch_of, **options):
    """The embeddings of one batch, padded and flat, on the CPU in float32; `batch_of(spec)`
    makes the batch."""
    found = {}
    for attention in ("padded", "flat"):
        spec = _spec(folder, attention=attention, backend="torch", **options)
        encoder = build_encoder(spec, "cpu", torch.float32)
        assert encoder.unpadded is (attention == "flat")
        assert encoder.notices == []
        found[attention] = encoder.embed_batch(batch_of(spec))
    return found["padded"], found["flat"]


def _lengths_texts(max_length: int) -> list[str]:
    """The shortest documents, typical ones, ones past the maximum and one of exactly it
    ("x " * (max_length - 2) with the two special tokens)."""
    return ["", "a", *sample_texts(12), "word " * 400, "x " * (max_length - 2)]


def _random_batch(lengths: list[int], vocabulary: int, seed: int = 0) -> TokenBatch:
    rng = np.random.default_rng(seed)
    return TokenBatch.from_sequences([rng.integers(5, vocabulary, n) for n in lengths])


@pytest.mark.parametrize("mode", ["cls", "mean", "lasttoken"])
def test_tiny_bert_flat_equals_padded_and_sentence_transformers(tiny_st, mode):
    from sentence_transformers import SentenceTransformer

    folder = tiny_st(mode)
    texts = _lengths_texts(64)

    def batch_of(spec):
        batch = _batch(spec, texts)
        # The shortest a tokenized text can be, one longer, and exactly the maximum.
        assert {2, 3, spec.max_length} <= set(batch.lengths.tolist())
        return batch

    padded, flat = _by_layout(folder, batch_of)
    reference = SentenceTransformer(str(folder), device="cpu").encode(texts, batch_size=4)
    assert flat.dense.shape == reference.shape == (len(texts), 32)
    assert cosines(flat.dense, padded.dense).min() >= 0.99999
    assert cosines(flat.dense, reference).min() >= 0.99999


@pytest.mark.parametrize("mode", ["cls", "mean", "lasttoken"])
def test_one_token_documents_beside_long_ones(tiny_st, mode):
    padded, flat = _by_layout(
        tiny_st(mode), lambda spec: _random_batch([64, 1, 37, 1, 64, 2, 1], 400)
    )
    assert cosines(flat.dense, padded.dense).min() >= 0.99999


def test_tiny_bge_m3_flat_equals_padded_and_flagembedding(tiny_bge_m3):
    texts = mixed_texts()
    outputs = ("dense", "sparse", "multivector")
    padded, flat = _by_layout(
        tiny_bge_m3, lambda spec: _batch(spec, texts), outputs=outputs, max_length=64
    )
    reference = bge_m3_reference(tiny_bge_m3, texts)
    assert cosines(flat.dense, padded.dense).min() >= 0.99999
    assert cosines(flat.dense, reference["dense_vecs"]).min() >= 0.99999

    assert sum(len(s.indices) for s in flat.sparse) > 100
    for ours, other, theirs in zip(
        flat.sparse, padded.sparse, reference["lexical_weights"], strict=True
    ):
        assert ours.indices.tolist() == other.indices.tolist() == sorted(map(int, theirs))
        expected = [theirs[str(i)] for i in ours.indices]
        np.testing.assert_allclose(ours.values, other.values, atol=1e-5, rtol=0)
        np.testing.assert_allclose(ours.values, expected, atol=1e-5, rtol=0)

    for ours, other, theirs in zip(
        flat.multivector, padded.multivector, reference["colbert_vecs"], strict=True
    ):
        assert ours.shape == other.shape == theirs.shape
        if len(ours):
            theirs = theirs / np.linalg.norm(theirs, axis=1, keepdims=True)
            assert cosines(ours, other).min() >= 0.99999
            assert cosines(ours, theirs).min() >= 0.99999


def test_xlm_roberta_positions_restart_per_document_and_skip_the_padding_id(tiny_bge_m3):
    # "<pad>" in a text is the padding id: RoBERTa gives it the padding position and does
    # not count it. One-token documents beside ones of the maximum length.
    texts = ["<pad> starts here", "in <pad> the middle <pad>", *sample_texts(6), "x " * 62]

    def batch_of(spec):
        batch = _batch(spec, texts)
        assert (batch.token_ids == spec.pad_token_id).sum() == 3
        sequences = np.split(batch.token_ids, np.cumsum(batch.lengths)[:-1])
        rng = np.random.default_rng(0)
        extra = [rng.integers(5, 500, n) for n in (1, 64, 1)]
        return TokenBatch.from_sequences([*sequences, *extra])

    padded, flat = _by_layout(tiny_bge_m3, batch_of, max_length=64)
    assert cosines(flat.dense, padded.dense).min() >= 0.99999


@pytest.mark.slow
def test_minilm_flat_matches_sentence_transformers_on_2000_documents(tmp_path, minilm):
    from sentence_transformers import SentenceTransformer

    lines = SAMPLE.read_text(encoding="utf-8").splitlines()
    texts = [json.loads(line)["text"] for line in lines]
    # A second thousand: the back halves of the sample's texts, other lengths again.
    texts += [" ".join(t.split()[len(t.split()) // 2 :]) for t in texts]
    records = [{"id": f"d{i}", "text": t} for i, t in enumerate(texts)]
    corpus = write_jsonl(tmp_path / "corpus.jsonl", records)
    out = tmp_path / "out"
    summary = embed_corpus(
        RunConfig(
            inputs=(str(corpus),),
            output=str(out),
            model=str(minilm),
            tokenize_workers=1,
            dtype=DType.FLOAT32,
            attention=Attention.FLAT,
            quiet=True,
        )
    )
    assert summary.docs == 2000
    assert summary.padding_efficiency == 1.0
    written = json.loads((out / RUN_DIRECTORY / "summary.json").read_text())
    assert written["attention"] == "flat" and written["backend"] == "torch"
    vectors = read_output(out)
    ours = np.array([vectors[r["id"]] for r in records])
    reference = SentenceTransformer(str(minilm), device="cpu").encode(
        texts, batch_size=64, normalize_embeddings=True
    )
    found = cosines(ours, reference)
    assert found.min() >= 0.99999, f"lowest cosine {found.min():.7f}"


class _Shapes(TorchDispatchMode):
    """Records the shape of every tensor the operators make."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[str, tuple[int, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for value in tree_flatten(result)[0]:
            if isinstance(value, torch.Tensor):
                self.shapes.append((str(func), tuple(value.shape)))
        return result


def _square(shapes: list[tuple[str, tuple[int, ...]]], longest: int) -> list:
    return [(f, s) for f, s in shapes if len(s) >= 3 and s[-2:] == (longest, longest)]


def test_a_flat_batch_makes_no_documents_by_length_by_length_tensor(tiny_st):
    longest = 120
    batch = _random_batch([longest, longest, 5, 1], 400)
    made = {}
    for attention in ("padded", "flat"):
        spec = _spec(tiny_st("mean"), attention=attention, backend="torch")
        encoder = build_encoder(spec, "cpu", torch.float32)
        with _Shapes() as recorded:
            encoder.embed_batch(batch)
        made[attention] = _square(recorded.shapes, longest)
    # The padded batch has its mask or its attention scores at [4, ..., 120, 120].
    assert any(s[0] == 4 for _, s in made["padded"]), made["padded"]
    assert made["flat"] == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_flat_batches_equal_padded_ones(tiny_st, tiny_bge_m3):
    outputs = ("dense", "sparse", "multivector")
    for folder, options in ((tiny_st("mean"), {}), (tiny_bge_m3, {"outputs": outputs})):
        found = {}
        for attention in ("padded", "flat"):
            spec = _spec(folder, attention=attention, max_length=64, **options)
            encoder = build_encoder(spec, "cuda:0", torch.bfloat16)
            assert encoder.unpadded is (attention == "flat")
            found[attention] = encoder.embed_batch(_batch(spec, mixed_texts()))
        padded, flat = found["padded"], found["flat"]
        assert cosines(flat.dense, padded.dense).min() >= 0.999
        for ours, theirs in zip(flat.multivector or (), padded.multivector or (), strict=True):
            assert ours.shape == theirs.shape


@pytest.mark.skipif(not openvino_installed(), reason="needs the openvino package")
def test_flat_batches_take_pytorch_where_auto_would_take_openvino(tiny_st):
    flat = _spec(tiny_st("cls"), attention="flat")
    assert choose_backend(flat, "cpu", torch.float32) is Backend.TORCH
    assert choose_backend(_spec(tiny_st("cls")), "cpu", torch.float32) is Backend.OPENVINO


def test_a_model_that_cannot_run_flat_runs_padded_with_one_warning(
    tiny_bert, tiny_splade, tmp_path
):
    from transformers import DistilBertConfig, DistilBertModel

    other = tmp_path / "distilbert"
    config = DistilBertConfig(vocab_size=400, dim=32, n_layers=1, n_heads=2, hidden_dim=64)
    DistilBertModel(config).save_pretrained(other)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (other / name).write_bytes((tiny_bert / name).read_bytes())
    for folder, options, reason in (
        (
            other,
            {"pooling": "mean"},
            "flat execution covers bert, llama, mistral, modernbert, nomic_bert, qwen2, qwen3, "
            "roberta, xlm-roberta, not distilbert",
        ),
        (tiny_splade, {}, "the splade family reads padded batches"),
    ):
        spec = _spec(folder, attention="flat", **options)
        encoder = build_encoder(spec, "cpu", torch.float32)
        assert encoder.unpadded is False
        assert encoder.notices == [f"{folder} runs padded batches: {reason}"]


def test_a_flat_run_packs_by_real_tokens_and_says_so(tmp_path, tiny_st):
    texts = sample_texts(60) + ["word " * 300, "a"]
    corpus = write_jsonl(
        tmp_path / "c.jsonl", [{"id": str(i), "text": t} for i, t in enumerate(texts)]
    )
    vectors = {}
    for attention in ("padded", "flat"):
        out = tmp_path / attention
        result = run_cli(
            corpus, tiny_st("mean"), out, "--attention", attention, "--max-batch-tokens", "256"
        )
        assert result.exit_code == 0, result.output
        summary = json.loads((out / RUN_DIRECTORY / "summary.json").read_text())
        assert summary["attention"] == attention
        vectors[attention] = read_output(out)
    assert summary["padding_efficiency"] == 1.0
    assert any(", torch, flat): dense" in line for line in summary_lines(summary))
    ids = list(vectors["padded"])
    padded = np.array([vectors["padded"][i] for i in ids])
    flat = np.array([vectors["flat"][i] for i in ids])
    assert cosines(flat, padded).min() >= 0.99999


@pytest.mark.slow
def test_a_compiled_flat_model_gives_the_padded_vectors(tiny_st):
    import bulkembed

    texts = _lengths_texts(64)
    found = {}
    for attention, compile_model in (("padded", False), ("flat", True)):
        encoder = bulkembed.load(
            str(tiny_st("mean")),
            dtype="float32",
            backend="torch",
            attention=attention,
            compile=compile_model,
            max_batch_tokens=128,
        )
        found[attention] = encoder.encode_document(texts).dense
    assert cosines(found["flat"], found["padded"]).min() >= 0.99999


def test_the_fallback_is_said_once_in_the_run_log(tmp_path, tiny_splade):
    corpus = write_jsonl(
        tmp_path / "c.jsonl", [{"id": str(i), "text": t} for i, t in enumerate(sample_texts(5))]
    )
    result = run_cli(
        corpus, tiny_splade, tmp_path / "out", "--attention", "flat", "--dtype", "auto"
    )
    assert result.exit_code == 0, result.output
    assert result.output.count("runs padded batches: the splade family reads padded batches") == 1


def test_flat_and_openvino_conflict(tiny_st, tmp_path):
    with pytest.raises(UsageError, match=r"^--attention flat and --backend openvino conflict"):
        _spec(tiny_st("cls"), attention="flat", backend="openvino")
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"id": "1", "text": "a"}])
    result = run_cli(
        corpus, tiny_st("cls"), tmp_path / "out", "--attention", "flat", "--backend", "openvino"
    )
    assert result.exit_code == 2
    assert "--attention flat and --backend openvino conflict" in result.output


def test_the_in_process_encoder_runs_flat_batches_too(tiny_bge_m3):
    import bulkembed

    texts = mixed_texts()
    found = {}
    for attention in ("padded", "flat"):
        encoder = bulkembed.load(
            str(tiny_bge_m3),
            dtype="float32",
            attention=attention,
            outputs=["dense", "sparse"],
            max_batch_tokens=256,
        )
        found[attention] = encoder.encode_document(texts)
    padded, flat = found["padded"], found["flat"]
    assert cosines(flat.dense, padded.dense).min() >= 0.99999
    for ours, theirs in zip(flat.sparse, padded.sparse, strict=True):
        assert ours.indices.tolist() == theirs.indices.tolist()
        np.testing.assert_allclose(ours.values, theirs.values, atol=1e-5, rtol=0)


def test_a_compiled_flat_model_has_no_graph_break_and_gives_the_eager_vectors(tiny_bert):
    from transformers import AutoModel

    from bulkembed.encoders.flat.bert import FlatTransformer

    model = FlatTransformer(AutoModel.from_pretrained(tiny_bert)).eval()
    lengths = np.array([9, 9, 5, 2, 1])
    input_ids = torch.randint(5, 400, (int(lengths.sum()),))
    sequences = Sequences.on_host(lengths)
    with torch.inference_mode():
        explained = torch._dynamo.explain(model)(input_ids, sequences)
    assert (explained.graph_break_count, explained.graph_count) == (0, 1)
    compiled = torch.compile(model, dynamic=True)
    with torch.inference_mode():
        for shape in ([9, 9, 5, 2, 1], [17, 3, 3], [2]):
            lengths = np.array(shape)
            input_ids = torch.randint(5, 400, (int(lengths.sum()),))
            sequences = Sequences.on_host(lengths)
            torch.testing.assert_close(
                compiled(input_ids, sequences), model(input_ids, sequences), atol=1e-5, rtol=1e-5
            )

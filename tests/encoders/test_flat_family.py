"""A flat model family written here, registered, and run: a decoder (GPT-2, causal attention,
last-token pooling) whose batches run flat give the vectors of the model run on each text
alone; without the causal flag they do not."""

import contextlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from conftest import _train_tokenizer
from helpers import sample_texts, write_jsonl
from torch import nn

from bulkembed.config import RunConfig
from bulkembed.encoders.flat import FlatFamily, register_flat_family, unregister_flat_family
from bulkembed.encoders.kernel_choice import AttentionShape
from bulkembed.encoders.kernels import FULL
from bulkembed.encoders.varlen import Sequences, varlen_attention
from bulkembed.engine.run import embed_corpus

TEXTS = 40


class FlatGPT2(nn.Module):
    """GPT-2 over a flat batch, from a loaded `GPT2Model` and its weights, attending as its
    family says (`causal`)."""

    def __init__(self, model: nn.Module, causal: bool) -> None:
        super().__init__()
        self.model = model
        self.config = model.config
        self.causal = causal
        self.heads = model.config.n_head

    def forward(self, input_ids: torch.Tensor, sequences: Sequences) -> torch.Tensor:
        model = self.model
        starts = sequences.cu_seqlens[:-1].long()
        every = torch.arange(len(input_ids), device=input_ids.device)
        positions = every - starts[sequences.token_documents]
        hidden = model.wte(input_ids) + model.wpe(positions)
        tokens, width = hidden.shape
        for block in model.h:
            projected = block.attn.c_attn(block.ln_1(hidden))
            query, key, value = (
                part.reshape(tokens, self.heads, width // self.heads)
                for part in projected.split(width, dim=-1)
            )
            context = varlen_attention(query, key, value, sequences, self.causal)
            hidden = hidden + block.attn.c_proj(context.reshape(tokens, width))
            hidden = hidden + block.mlp(block.ln_2(hidden))
        return model.ln_f(hidden)


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer GPT-2 with hidden size 32 and the tests' WordPiece tokenizer."""
    from transformers import GPT2Config, GPT2Model

    folder = tmp_path_factory.mktemp("tiny-gpt2")
    _train_tokenizer(folder)
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=400,
        n_embd=32,
        n_layer=2,
        n_head=2,
        n_positions=128,
        bos_token_id=2,
        eos_token_id=3,
    )
    GPT2Model(config).eval().save_pretrained(folder)
    return folder


@contextlib.contextmanager
def _registered(family: FlatFamily) -> Iterator[None]:
    """`family` registered for the block's duration."""
    register_flat_family(family)
    try:
        yield
    finally:
        unregister_flat_family(family)


def _run(corpus: Path, model: Path, out: Path) -> tuple[dict[str, np.ndarray], str]:
    """The vectors a flat run writes, by id, and the layout it ran."""
    summary = embed_corpus(
        RunConfig(
            inputs=(str(corpus),),
            output=str(out),
            model=str(model),
            pooling="last-token",
            normalize=False,
            attention="flat",
            dtype="float32",
            tokenize_workers=0,
        )
    )
    table = pq.read_table(out)
    vectors = dict(zip(table["id"].to_pylist(), table["dense"].to_numpy(), strict=True))
    return {k: np.asarray(v) for k, v in vectors.items()}, summary.run["attention"]


def _alone(model: Path, corpus_texts: list[str]) -> np.ndarray:
    """Each text's last hidden state at its last token, the model run on the text alone."""
    from transformers import AutoTokenizer, GPT2Model

    tokenizer = AutoTokenizer.from_pretrained(model)
    gpt2 = GPT2Model.from_pretrained(model).eval()
    rows = []
    with torch.no_grad():
        for text in corpus_texts:
            ids = tokenizer(text, truncation=True, max_length=128, return_tensors="pt")
            rows.append(gpt2(input_ids=ids["input_ids"]).last_hidden_state[0, -1].numpy())
    return np.stack(rows)


def test_a_registered_decoder_family_runs_flat(tmp_path, tiny_gpt2):
    texts = [" ".join(t.split()[: 3 + i % 40]) for i, t in enumerate(sample_texts(TEXTS))]
    corpus = write_jsonl(
        tmp_path / "c.jsonl", [{"id": f"d{i}", "text": t} for i, t in enumerate(texts)]
    )
    expected = _alone(tiny_gpt2, texts)

    padded, layout = _run(corpus, tiny_gpt2, tmp_path / "unregistered")
    assert layout == "padded"  # no family covers gpt2 yet
    assert np.allclose(np.stack([padded[f"d{i}"] for i in range(TEXTS)]), expected, atol=1e-5)

    with _registered(FlatFamily("gpt2", frozenset({"gpt2"}), FlatGPT2, causal=True)):
        flat, layout = _run(corpus, tiny_gpt2, tmp_path / "flat")
    assert layout == "flat"
    found = np.stack([flat[f"d{i}"] for i in range(TEXTS)])
    assert np.abs(found - expected).max() < 1e-5
    # What its attention computes, for the choice of a kernel: from its config and flag.
    from transformers import GPT2Model

    module = FlatGPT2(GPT2Model.from_pretrained(tiny_gpt2), causal=True)
    assert AttentionShape.of(module, 128) == AttentionShape(2, 2, 16, ((True, FULL),), 128)

    # The same module in a family without the causal flag attends both ways: not what the
    # model computes.
    with _registered(FlatFamily("gpt2", frozenset({"gpt2"}), FlatGPT2)):
        unmasked, layout = _run(corpus, tiny_gpt2, tmp_path / "unmasked")
    assert layout == "flat"
    assert np.abs(np.stack([unmasked[f"d{i}"] for i in range(TEXTS)]) - expected).max() > 1e-2

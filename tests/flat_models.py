"""The flat families' equality tests: random documents, and a model's last hidden states of
them run padded (transformers, attention mask) and flat (bulkembed), laid end to end; a
recipe's vectors through the CLI, flat and padded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from helpers import embed_texts, sample_texts

from bulkembed.contracts import RUN_DIRECTORY
from bulkembed.encoders.varlen import Sequences


def random_documents(lengths: list[int], vocabulary: int = 400) -> list[torch.Tensor]:
    """Token ids of documents of `lengths`, drawn past the special tokens (0 to 3)."""
    rng = np.random.default_rng(0)
    return [torch.from_numpy(rng.integers(4, vocabulary, n)) for n in lengths]


def padded_hidden_states(model: Any, documents: list[torch.Tensor]) -> torch.Tensor:
    """The model's last hidden state of each document's tokens, run padded on the right
    (attention mask), laid end to end."""
    lengths = torch.tensor([len(d) for d in documents])
    ids = torch.nn.utils.rnn.pad_sequence(documents, batch_first=True, padding_value=0)
    mask = (torch.arange(ids.shape[1]) < lengths.unsqueeze(1)).long()
    with torch.no_grad():
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
    return torch.cat([hidden[i, :n] for i, n in enumerate(lengths.tolist())])


def flat_hidden_states(
    module: Any, documents: list[torch.Tensor], lengths: list[int] | None = None
) -> torch.Tensor:
    """The flat module's last hidden states of `documents` laid end to end, as documents of
    their own lengths (or of `lengths`)."""
    lengths = [len(d) for d in documents] if lengths is None else lengths
    with torch.no_grad():
        return module(torch.cat(documents), Sequences.on_host(np.array(lengths)))


def flat_and_padded_runs(
    folder: Path, model: Path, recipe: str, column: str
) -> dict[str, list[np.ndarray]]:
    """`bulkembed run` of 12 sample texts, an empty one, a short one and one past the 64
    tokens kept, with `recipe` on `model` in PyTorch and float32, flat and padded: the
    `column` vectors of each layout in text order, once `summary.json` says it ran."""
    texts = sample_texts(12) + ["", "short", "word " * 100]
    found = {}
    for attention in ("flat", "padded"):
        arguments = ["--recipe", recipe, "--attention", attention, "--backend", "torch"]
        arguments += ["--max-length", "64", "--dtype", "float32"]
        table, out = embed_texts(folder / attention, model, texts, *arguments)
        summary = json.loads((out / RUN_DIRECTORY / "summary.json").read_text())
        assert summary["attention"] == attention
        # On a CPU no kernel runs: flat batches attend by the reference.
        assert summary["attention_kernel"] == ("reference" if attention == "flat" else None)
        rows = table.column(column).to_pylist()
        found[attention] = [np.asarray(row, dtype=np.float64) for row in rows]
    return found

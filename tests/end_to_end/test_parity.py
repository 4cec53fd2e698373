"""The real all-MiniLM-L6-v2 through the whole pipeline against sentence-transformers."""

import numpy as np
import pytest
from helpers import SAMPLE, read_output

from bulkembed import embed_corpus
from bulkembed.config import DType, RunConfig

PARITY_DOCS = 300


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch", "openvino"])
def test_minilm_matches_sentence_transformers_on_real_text(tmp_path, minilm, backend):
    import json

    from sentence_transformers import SentenceTransformer

    records = [json.loads(line) for line in SAMPLE.read_text(encoding="utf-8").splitlines()]
    records = records[:PARITY_DOCS]
    summary = embed_corpus(
        RunConfig(
            inputs=(str(SAMPLE),),
            output=str(tmp_path / "out"),
            model=str(minilm),
            limit=PARITY_DOCS,
            tokenize_workers=1,
            dtype=DType.FLOAT32,
            backend=backend,
            quiet=True,
        )
    )
    vectors = read_output(tmp_path / "out")
    assert list(vectors) == [r["id"] for r in records]
    reference = SentenceTransformer(str(minilm), device="cpu").encode(
        [r["text"] for r in records], batch_size=32, normalize_embeddings=True
    )
    ours = np.array([vectors[r["id"]] for r in records])
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, rtol=1e-5)
    cosines = (ours * reference).sum(axis=1)
    assert cosines.min() >= 0.99999, f"lowest cosine {cosines.min():.7f}"
    assert summary.truncated > 0  # the sample holds documents past 256 tokens
    assert summary.docs == PARITY_DOCS

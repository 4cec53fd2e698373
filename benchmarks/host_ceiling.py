"""The host side's ceiling: how fast `bulkembed run` goes when the model costs nothing.

A GPU runs BGE-M3 at a few hundred thousand tokens/s; the host (reading, tokenizing,
packing, post-processing, writing) must keep up. With no GPU at hand, this takes the model
out of the picture: it builds a BGE-M3-shaped model with zero transformer layers (XLM-R
embeddings, hidden 1024, max length 8192, the sparse head 1024→1 and the ColBERT head
1024→1024, a unigram tokenizer trained on the corpus), offline, and runs the CLI end to
end on a real-text corpus (`corpus.py`) for `dense`, `dense,sparse` and
`dense,sparse,multivector` (float32 and float16 outputs). In the same run it measures:

- tokenizer_tokens_per_s: the rate of the tokenizer processes alone (same count), reading
  and tokenizing the corpus and discarding the tokens;
- disk_mb_per_s: the disk's sequential write rate, writing as many bytes as the largest
  output with 8 MB writes and an fsync, in the directory the outputs go to;
- per run: tokens/s end to end (whole process, start-up included) and while embedding
  (from `summary.json`), the ratio to the tokenizer rate, MB written and MB/s end to end
  and over the write stage's own busy seconds (`writer_mb_per_s`, what the writer could
  sustain were the rest free), the busy seconds of each stage (`stage_seconds` of
  `summary.json`), and CPU seconds per million tokens over the whole process tree.

On a CPU the zero-layer model still costs its embedding lookups and layer norm, and with
multi-vectors the 1024×1024 ColBERT head: a GPU's work that the `model` stage shows here.

Prints one JSON object.

    python benchmarks/host_ceiling.py [--docs 5000 --copies 4] [--workers N] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path

from corpus import build, write
from memory import measure

HIDDEN = 1024
MAX_LENGTH = 8192
VOCABULARY = 32000
RUNS = (
    ("dense", "float32"),
    ("dense,sparse", "float32"),
    ("dense,sparse,multivector", "float32"),
    ("dense,sparse,multivector", "float16"),
)
WRITE_BLOCK = 8 << 20


def build_model(folder: Path, texts: list[str]) -> None:
    """The zero-layer BGE-M3-shaped model folder, with a tokenizer trained on `texts`."""
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import XLMRobertaConfig, XLMRobertaModel, XLMRobertaTokenizerFast

    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer = trainers.UnigramTrainer(
        vocab_size=VOCABULARY, special_tokens=specials, unk_token="<unk>"
    )
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
    )
    XLMRobertaTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        sep_token="</s>",
        cls_token="<s>",
        unk_token="<unk>",
        pad_token="<pad>",
        mask_token="<mask>",
        model_max_length=MAX_LENGTH,
    ).save_pretrained(folder)
    torch.manual_seed(0)
    config = XLMRobertaConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=HIDDEN,
        num_hidden_layers=0,
        num_attention_heads=16,
        intermediate_size=4 * HIDDEN,
        max_position_embeddings=MAX_LENGTH + 2,
        pad_token_id=1,
    )
    XLMRobertaModel(config, add_pooling_layer=False).eval().save_pretrained(folder)
    torch.save(torch.nn.Linear(HIDDEN, 1).state_dict(), folder / "sparse_linear.pt")
    torch.save(torch.nn.Linear(HIDDEN, HIDDEN).state_dict(), folder / "colbert_linear.pt")


def tokenizer_rate(corpus: list[Path], model: Path, workers: int) -> dict:
    """Read and tokenize the corpus as a run does, on `workers` processes; discard it."""
    from bulkembed.config import RunConfig
    from bulkembed.engine.plan import plan_run
    from bulkembed.progress import QuietReporter
    from bulkembed.tokenize import TokenizerPool

    config = RunConfig(
        inputs=tuple(map(str, corpus)),
        model=str(model),
        recipe="bge-m3",
        output=str(corpus[0].parent / "unused"),
        devices="cpu",
        tokenize_workers=workers,
    )
    plan = plan_run(config, QuietReporter())
    started = time.perf_counter()
    tokens = 0
    with TokenizerPool(plan.tokenizer_settings, plan.workers) as pool:
        for tokenized in pool.map(plan.reader.read()):
            tokens += int(tokenized.lengths.sum())
    seconds = time.perf_counter() - started
    return {"tokens": tokens, "seconds": round(seconds, 2), "tokens_per_s": round(tokens / seconds)}


def disk_rate(folder: Path, size: int) -> float:
    """MB/s of writing `size` bytes sequentially into `folder`, fsync included."""
    block = os.urandom(WRITE_BLOCK)
    path = folder / "disk-rate.bin"
    started = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(max(1, size // WRITE_BLOCK)):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    seconds = time.perf_counter() - started
    path.unlink()
    return max(1, size // WRITE_BLOCK) * WRITE_BLOCK / seconds / 1e6


def _bytes_under(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*.parquet"))


def one_run(corpus: list[Path], model: Path, out: Path, outputs: str, dtype_out: str, workers: int):
    """One CLI run, end to end; its figures."""
    options = ["--recipe", "bge-m3", "--devices", "cpu", "--dtype", "float32"]
    options += ["--outputs", outputs, "--dtype-out", dtype_out, "--tokenize-workers", str(workers)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    run = measure(corpus, out, str(model), *options)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    summary = json.loads((out / "_bulkembed" / "summary.json").read_text())
    written = _bytes_under(out)
    return {
        "outputs": outputs,
        "dtype_out": dtype_out,
        "tokens_per_s_end_to_end": round(run["tokens"] / run["wall_seconds"]),
        "tokens_per_s_embedding": round(run["tokens_per_s"]),
        "wall_seconds": run["wall_seconds"],
        "mb_written": round(written / 1e6, 1),
        "mb_per_s_end_to_end": round(written / 1e6 / run["wall_seconds"], 1),
        "writer_mb_per_s": round(written / 1e6 / max(summary["stage_seconds"]["write"], 1e-9), 1),
        "stage_seconds": summary["stage_seconds"],
        "cpu_seconds_per_million_tokens": round(cpu / run["tokens"] * 1e6, 2),
        "peak_rss_mb": run["peak_rss_mb"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=5000)
    parser.add_argument("--copies", type=int, default=4, help="the corpus repeated, ids distinct")
    parser.add_argument("--workers", type=int, default=1, help="tokenizer processes")
    parser.add_argument("--dir", type=Path, help="where to write (default: a temporary folder)")
    args = parser.parse_args()
    records = build(args.docs, args.copies)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        corpus = write(records, root / "corpus", files=1, fmt="jsonl")
        model = root / "model"
        build_model(model, [r["text"] for r in records[: args.docs]])
        tokenizer = tokenizer_rate(corpus, model, args.workers)
        runs = []
        for outputs, dtype_out in RUNS:
            out = root / "out"
            result = one_run(corpus, model, out, outputs, dtype_out, args.workers)
            result["of_tokenizer_rate"] = round(
                result["tokens_per_s_end_to_end"] / tokenizer["tokens_per_s"], 3
            )
            runs.append(result)
            shutil.rmtree(out)
        largest = max(r["mb_written"] for r in runs)
        disk = disk_rate(root, int(largest * 1e6))
        for result in runs:
            result["of_disk_rate"] = round(result["mb_per_s_end_to_end"] / disk, 3)
            result["writer_of_disk_rate"] = round(result["writer_mb_per_s"] / disk, 3)
    print(
        json.dumps(
            {
                "cpu": _cpu_name(),
                "cores": os.cpu_count(),
                "docs": len(records),
                "tokenizer": tokenizer,
                "disk_mb_per_s": round(disk, 1),
                "runs": runs,
            }
        )
    )


def _cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


if __name__ == "__main__":
    main()

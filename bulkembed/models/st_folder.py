"""The sentence-transformers folder layout: `modules.json` and the files it points to.

Supported modules: Transformer, Pooling, Normalize (dense models); MLMTransformer and
SpladePooling (SPLADE); Transformer followed by Dense, with PyLate's ColBERT settings in
`config_sentence_transformers.json` (multi-vector models). Anything else is refused rather
than silently skipped.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field
from typing import Any

from bulkembed.config import Pooling
from bulkembed.errors import ModelError
from bulkembed.models.model_files import model_file, read_json

_ST_POOLING_KEYS = {
    "pooling_mode_cls_token": Pooling.CLS,
    "pooling_mode_mean_tokens": Pooling.MEAN,
    "pooling_mode_lasttoken": Pooling.LAST_TOKEN,
}
_ST_POOLING_NAMES = {"cls": Pooling.CLS, "mean": Pooling.MEAN, "lasttoken": Pooling.LAST_TOKEN}
_SUPPORTED_MODULES = {
    "Transformer",
    "Pooling",
    "Normalize",
    "MLMTransformer",
    "SpladePooling",
    "Dense",
}


@dataclass(frozen=True)
class ColbertLayout:
    """A PyLate ColBERT model: a token-level Dense projection after the transformer, and a
    prefix token put after the first token of every document."""

    projection: str
    document_prefix: str
    document_length: int | None
    skiplist_words: tuple[str, ...] = field(default=tuple(string.punctuation))


@dataclass(frozen=True)
class SentenceTransformersInfo:
    pooling: Pooling | None = None
    normalize: bool | None = None
    max_length: int | None = None
    lowercase: bool = False
    prompts: dict[str, str] | None = None
    default_prompt_name: str | None = None
    splade: bool = False
    colbert: ColbertLayout | None = None


def _pooling_from_st_config(config: dict[str, Any], where: str) -> Pooling:
    if config.get("include_prompt") is False:
        raise ModelError(f"{where}: pooling that excludes the prompt is not supported")
    if "pooling_mode" in config:
        mode = config["pooling_mode"]
        if mode not in _ST_POOLING_NAMES:
            raise ModelError(
                f"{where}: pooling mode {mode!r} is not supported (cls, mean, lasttoken)"
            )
        return _ST_POOLING_NAMES[mode]
    active = [key for key, value in config.items() if key.startswith("pooling_mode") and value]
    if len(active) != 1 or active[0] not in _ST_POOLING_KEYS:
        raise ModelError(
            f"{where}: pooling {active} is not supported (one of cls, mean, lasttoken)"
        )
    return _ST_POOLING_KEYS[active[0]]


def read_sentence_transformers_info(source: str, revision: str | None) -> SentenceTransformersInfo:
    modules = read_json(model_file(source, revision, "modules.json"))
    if modules is None:
        return SentenceTransformersInfo()
    pooling = None
    normalize = False
    for module in modules:
        kind = module.get("type", "").rsplit(".", 1)[-1]
        if kind not in _SUPPORTED_MODULES:
            raise ModelError(
                f"{source}: sentence-transformers module {kind} is not supported "
                f"(supported: {', '.join(sorted(_SUPPORTED_MODULES))})"
            )
        where = f"{source}/{module['path']}/config.json"
        if kind == "Pooling":
            config = read_json(model_file(source, revision, f"{module['path']}/config.json"))
            pooling = _pooling_from_st_config(config or {}, where)
        if kind == "SpladePooling":
            config = read_json(model_file(source, revision, f"{module['path']}/config.json"))
            _check_splade_config(config or {}, where)
        normalize = normalize or kind == "Normalize"
    bert_config = read_json(model_file(source, revision, "sentence_bert_config.json")) or {}
    st_config = read_json(model_file(source, revision, "config_sentence_transformers.json")) or {}
    return SentenceTransformersInfo(
        pooling=pooling,
        normalize=normalize,
        max_length=bert_config.get("max_seq_length"),
        lowercase=bool(bert_config.get("do_lower_case", False)),
        prompts=st_config.get("prompts") or {},
        default_prompt_name=st_config.get("default_prompt_name"),
        splade=any(m.get("type", "").endswith(".SpladePooling") for m in modules),
        colbert=_colbert_layout(source, modules, st_config, pooling),
    )


def _colbert_layout(
    source: str, modules: list[dict[str, Any]], st_config: dict[str, Any], pooling: Any
) -> ColbertLayout | None:
    dense = [m for m in modules if m.get("type", "").endswith(".Dense")]
    if not dense:
        return None
    if pooling is not None or "document_prefix" not in st_config:
        raise ModelError(
            f"{source}: a Dense module is supported only in PyLate ColBERT models "
            "(Transformer then Dense, with document_prefix in config_sentence_transformers.json)"
        )
    if len(dense) != 1:
        raise ModelError(
            f"{source}: ColBERT models with {len(dense)} Dense modules are not supported"
        )
    words = st_config.get("skiplist_words")
    return ColbertLayout(
        projection=dense[0]["path"],
        document_prefix=st_config["document_prefix"],
        document_length=st_config.get("document_length"),
        skiplist_words=tuple(words) if words is not None else tuple(string.punctuation),
    )


def _check_splade_config(config: dict[str, Any], where: str) -> None:
    strategy = config.get("pooling_strategy", "max")
    activation = config.get("activation_function", "relu")
    if (strategy, activation) != ("max", "relu"):
        raise ModelError(
            f"{where}: SPLADE pooling {strategy} with {activation} is not supported (max, relu)"
        )
